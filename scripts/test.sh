#!/usr/bin/env bash
# Runs layup's tests: the C++ unit tests and the oracle tests that compare layup with PyTorch,
# Hugging Face transformers and tiktoken. Installs what is missing first (Debian packages through
# setup.sh; the Python oracles through oracle_venv.sh, ~6 GB the first time).
#   ./scripts/test.sh             every test, each in the build that checks it most (what CI runs):
#                                 --tsan, --sanitize, then --oracles, each stage's minutes printed
#   ./scripts/test.sh --release   one Release build in build/, every test: the quicker way
#   ./scripts/test.sh --tsan      ThreadSanitizer build in build-tsan/, the threads' suites
#   ./scripts/test.sh --sanitize  ASan + UBSan build in build-sanitize/, every C++ test
#   ./scripts/test.sh --oracles   Release build in build/: the oracles, the CUDA code and its
#                                 tests, and the C++ tests ASan cannot run (LAYUP_UNIT_TESTS=OFF)
set -euo pipefail
cd "$(dirname "$0")/.."

export LAYUP_VENV=${LAYUP_VENV:-$HOME/.cache/layup/venv}

# The sanitizer builds compile at -O1 with line tables only (-g1): a report still names each
# frame's file and line, and the build takes about half the time of -O2 -g (docs/testing.md).
sanitizer_flags=-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
# Their test executables parse GoogleTest and nlohmann/json once, not once per test file.
test_headers=-DLAYUP_PRECOMPILED_HEADERS=ON

sanitize() {
  # The CUDA code is built (and so checked) by the Release build; this one covers the CPU path.
  # The C++ tests and the layup they run; the oracle tools are for the Release build's oracles.
  BUILD_DIR=build-sanitize BUILD_TARGETS="layup_tests layup" \
    CMAKE_ARGS="-DLAYUP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF $test_headers" \
    ./scripts/setup.sh "$sanitizer_flags"
  # OpenMP's runtime keeps thread pools alive at exit; that is not a leak of ours.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-sanitize --output-on-failure -j "$(nproc)" -LE oracle
}

tsan() {
  # layup_thread_tests (CMakeLists.txt): every suite of src/schedule/, where the device thread,
  # the consumer and the CPU workers hand gradients and updates to each other, and those of the
  # thread pool, the writer and the ledger they share. OpenMP's runtime is not built with TSan, so
  # its own synchronisation would read as races: one OpenMP thread keeps it out of the way.
  BUILD_DIR=build-tsan BUILD_TARGETS=layup_thread_tests \
    CMAKE_ARGS="-DLAYUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF $test_headers" \
    ./scripts/setup.sh "$sanitizer_flags"
  # LayupStress, about half of the suites' time, in a process of its own; the other tests dealt
  # out (gtest deals them in turn) over the other cores. The output of each process is printed
  # whole once all have ended.
  local tests=(env OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 build-tsan/layup_thread_tests)
  local longest='LayupStress.*' shards=$(($(nproc) > 1 ? $(nproc) - 1 : 1))
  local logs pids=() failed=0
  logs=$(mktemp -d)
  "${tests[@]}" --gtest_filter="$longest" >"$logs/longest" 2>&1 &
  pids+=($!)
  for ((shard = 0; shard < shards; shard++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
      "${tests[@]}" --gtest_filter="-$longest" >"$logs/$shard" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  cat "$logs/longest" "$logs"/[0-9]*
  rm -r "$logs"
  return "$failed"
}

# A Release build in build/ and its ctest; $1 is ON to build and run every C++ test here too.
release() {
  CMAKE_ARGS="-DLAYUP_PYTHON=$LAYUP_VENV/bin/python -DLAYUP_UNIT_TESTS=$1" ./scripts/setup.sh
  ctest --test-dir build --output-on-failure -j "$(nproc)"
}

# Each stage's minutes, so a slow run says where its time went.
stage() {
  local start=$SECONDS
  "$@"
  echo "stage '$*': $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
}

case "${1:-}" in
  --tsan) tsan ;;
  --sanitize) sanitize ;;
  --oracles) ./scripts/oracle_venv.sh; release OFF ;;
  --release) ./scripts/oracle_venv.sh; release ON ;;
  "")
    # The Python oracles install (mostly a download) while the sanitizer builds compile; the
    # Release build needs them from its configure on (the CUDA build looks for cuDNN there).
    venv_log=$(mktemp)
    stage ./scripts/oracle_venv.sh >"$venv_log" 2>&1 &
    venv_pid=$!
    stage tsan
    stage sanitize
    wait "$venv_pid" || { cat "$venv_log"; exit 1; }
    cat "$venv_log"
    stage release OFF
    ;;
  *)
    echo "usage: $0 [--release | --tsan | --sanitize | --oracles]" >&2
    exit 2
    ;;
esac
