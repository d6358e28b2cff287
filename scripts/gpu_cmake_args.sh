# Sourced by the GPU-machine scripts (src/backend/cuda/run_gpu_tests.sh, bench/run_h200*.sh) and by
# scripts/build_device_binary.sh: sets cmake_args for a Release build with the CUDA backend for
# sm_90, taking the dependencies the GPU machine lacks from $repo/.carry (made by
# scripts/make_device_carry.sh) when present:
#   .carry/usr or .carry  an install prefix (include/, share/cmake/...): CMAKE_PREFIX_PATH, CPATH
#   .carry/googletest     GoogleTest's source tree, built with the project (-DLAYUP_GTEST_SOURCE)
# Needs $repo (the repository root).
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DLAYUP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
prefixes=()
for prefix in "$repo/.carry/usr" "$repo/.carry"; do
  if [ -d "$prefix/include" ]; then
    prefixes+=("$prefix")
    export CPATH="$prefix/include${CPATH:+:$CPATH}"
  fi
done
if [ ${#prefixes[@]} -gt 0 ]; then
  cmake_args+=("-DCMAKE_PREFIX_PATH=$(IFS=';'; echo "${prefixes[*]}")")
fi
if [ -d "$repo/.carry/googletest" ]; then
  cmake_args+=("-DLAYUP_GTEST_SOURCE=$repo/.carry/googletest")
fi
