#!/usr/bin/env bash
# Builds layup with the CUDA backend for Hopper (sm_90: H100/H200) and runs the CUDA tests, then
# compute-sanitizer's memcheck and racecheck over the op and device tests.
#
#   src/backend/cuda/run_gpu_tests.sh [all|build|test|memcheck|racecheck]   (default: all)
#
# Each stage needs the ones before it in the same build directory (BUILD, default build-gpu in the
# repository), so the stages can also run as separate calls on a machine that stays up. Logs go
# to $OUT when it is set (the device tool's output folder), else to the build directory. The exit
# status is non-zero when any stage failed; every stage still runs.
#
# Dependencies the GPU machine may lack (GoogleTest, Eigen, nlohmann-json, CLI11) are taken from
# .carry/ in the repository when present; make it on a machine that has them with
# scripts/make_device_carry.sh and carry that folder along:
#   .carry/usr        an install prefix (include/, share/cmake/...): CMAKE_PREFIX_PATH and CPATH
#   .carry/googletest GoogleTest's source tree, built here (-DLAYUP_GTEST_SOURCE)
#   .carry/include    (also accepted) a prefix whose include/ holds the headers
set -uo pipefail

stage=${1:-all}
repo=$(cd "$(dirname "$0")/../../.." && pwd)
build=${BUILD:-$repo/build-gpu}
logs=${OUT:-$build}
mkdir -p "$build" "$logs"
export PATH="/usr/local/cuda/bin:$PATH"
status=0

# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"

run_stage() {  # name, command...: runs it with its output in $logs/<name>.log
  local name=$1
  shift
  echo "=== $name: $*"
  local started=$SECONDS
  "$@" > "$logs/$name.log" 2>&1
  local result=$?
  tail -n 40 "$logs/$name.log"
  echo "=== $name: exit $result after $((SECONDS - started)) s (log: $logs/$name.log)"
  [ $result -eq 0 ] || status=1
  return $result
}

tests=$build/layup_cuda_tests
# The op and device tests; the backend tests run full training steps and take long under the
# sanitizers without reaching kernels the op tests miss.
sanitized_filter='Sizes/*:CudaDevice.*:EmbeddingPlan.*'

if [ "$stage" = all ] || [ "$stage" = build ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  run_stage configure cmake -S "$repo" -B "$build" "${cmake_args[@]}" &&
    run_stage build cmake --build "$build" -j"$(nproc)" --target layup_cuda_tests ||
    { echo "build failed"; exit 1; }
fi
if [ "$stage" = all ] || [ "$stage" = test ]; then
  run_stage cuda_tests "$tests" --gtest_color=no
fi
if [ "$stage" = all ] || [ "$stage" = memcheck ]; then
  run_stage memcheck compute-sanitizer --tool memcheck --error-exitcode 86 \
    "$tests" --gtest_filter="$sanitized_filter" --gtest_brief=1
fi
if [ "$stage" = all ] || [ "$stage" = racecheck ]; then
  run_stage racecheck compute-sanitizer --tool racecheck \
    --error-exitcode 86 "$tests" --gtest_filter="$sanitized_filter" --gtest_brief=1
fi
exit $status
