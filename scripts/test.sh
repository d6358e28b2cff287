#!/usr/bin/env bash
# Runs layup's whole test suite: the C++ unit tests and the oracle tests that compare layup with
# PyTorch, Hugging Face transformers and tiktoken. Installs what is missing first (Debian
# packages through setup.sh; the Python oracles through oracle_venv.sh, ~6 GB the first time).
#   ./scripts/test.sh               Release build in build/, every test
#   ./scripts/test.sh --sanitize    ASan + UBSan build in build-sanitize/, the C++ tests
#   ./scripts/test.sh --tsan        ThreadSanitizer build in build-tsan/, the threads' tests
set -euo pipefail
cd "$(dirname "$0")/.."

# The sanitizer builds compile at -O1 with line tables only (-g1): a report still names each
# frame's file and line, and the build takes about half the time of -O2 -g (docs/testing.md).
sanitizer_flags=-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"

if [ "${1:-}" = "--sanitize" ]; then
  # The CUDA code is built (and so checked) by the Release build; this one covers the CPU path.
  # The C++ tests and the layup they run; the oracle tools are for the Release build's oracles.
  BUILD_DIR=build-sanitize BUILD_TARGETS="layup_tests layup" \
    CMAKE_ARGS="-DLAYUP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF" \
    ./scripts/setup.sh "$sanitizer_flags"
  # OpenMP's runtime keeps thread pools alive at exit; that is not a leak of ours.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  ctest --test-dir build-sanitize --output-on-failure -j "$(nproc)" -LE oracle
  exit 0
fi

if [ "${1:-}" = "--tsan" ]; then
  # layup_thread_tests (CMakeLists.txt): every suite of src/schedule/, where the device thread,
  # the consumer and the CPU workers hand gradients and updates to each other, and those of the
  # thread pool, the writer and the ledger they share. OpenMP's runtime is not built with TSan, so
  # its own synchronisation would read as races: one OpenMP thread keeps it out of the way.
  BUILD_DIR=build-tsan BUILD_TARGETS=layup_thread_tests \
    CMAKE_ARGS="-DLAYUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF" \
    ./scripts/setup.sh "$sanitizer_flags"
  # One shard of the tests per core (gtest deals the tests out in turn), each shard's output
  # printed whole when it ends.
  shards=$(nproc)
  logs=$(mktemp -d)
  pids=()
  for ((shard = 0; shard < shards; shard++)); do
    OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard \
      build-tsan/layup_thread_tests >"$logs/$shard" 2>&1 &
    pids+=($!)
  done
  failed=0
  for ((shard = 0; shard < shards; shard++)); do
    wait "${pids[$shard]}" || failed=1
    cat "$logs/$shard"
  done
  rm -r "$logs"
  exit "$failed"
fi

venv=${LAYUP_VENV:-$HOME/.cache/layup/venv}
LAYUP_VENV=$venv ./scripts/oracle_venv.sh
CMAKE_ARGS="-DLAYUP_PYTHON=$venv/bin/python" ./scripts/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
