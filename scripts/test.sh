#!/usr/bin/env bash
# Runs layup's whole test suite: the C++ unit tests and the oracle tests that compare layup with
# PyTorch, Hugging Face transformers and tiktoken. Installs what is missing first (Debian
# packages through setup.sh; the Python oracles into a virtual environment, ~3 GB the first time).
#   ./scripts/test.sh               Release build in build/, every test
#   ./scripts/test.sh --sanitize    ASan + UBSan build in build-sanitize/, the C++ tests
#   ./scripts/test.sh --tsan        ThreadSanitizer build in build-tsan/, the schedules' tests
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--sanitize" ]; then
  # The CUDA code is built (and so checked) by the Release build; this one covers the CPU path.
  BUILD_DIR=build-sanitize CMAKE_ARGS="-DLAYUP_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF" \
    ./scripts/setup.sh
  # OpenMP's runtime keeps thread pools alive at exit; that is not a leak of ours.
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  ctest --test-dir build-sanitize --output-on-failure -j 2 -E oracle_pytest
  exit 0
fi

if [ "${1:-}" = "--tsan" ]; then
  BUILD_DIR=build-tsan CMAKE_ARGS="-DLAYUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLAYUP_CUDA=OFF" \
    ./scripts/setup.sh
  # Every suite in src/schedule/, where the device thread, the consumer and the CPU workers hand
  # gradients and updates to each other, and the thread pool and ledger they share. OpenMP's
  # runtime is not built with TSan, so its own synchronisation would read as races: one OpenMP
  # thread keeps it out of the way.
  suites=$(grep -ho '^TEST\w*(\w*' src/schedule/*_test.cpp src/optim/host_adamw_test.cpp src/io/streamed_file_writer_test.cpp \
    src/memory/memory_accountant_test.cpp | sed 's/.*(//' | sort -u | sed 's/$/.*/' | paste -sd:)
  OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 build-tsan/layup_tests --gtest_filter="$suites"
  exit 0
fi

venv=${LAYUP_VENV:-$HOME/.cache/layup/venv}
oracles=(torch transformers tiktoken safetensors numpy pytest regex)
if ! "$venv/bin/python" -c "import torch, transformers, tiktoken, safetensors, numpy, pytest, regex" 2>/dev/null; then
  echo "installing the Python oracles into $venv"
  python3 -m venv "$venv" || { apt-get install -y -qq python3-venv && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "${oracles[@]}"
fi
# The cuDNN frontend's headers, which the CUDA build compiles its fused attention against (torch
# brings cuDNN itself). Only the headers are used, so not the package's Python dependencies.
if ! "$venv/bin/python" -c "import importlib.util; assert importlib.util.find_spec('cudnn')" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps nvidia-cudnn-frontend
fi
CMAKE_ARGS="-DLAYUP_PYTHON=$venv/bin/python" ./scripts/setup.sh
ctest --test-dir build --output-on-failure -j 2
