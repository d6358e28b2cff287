#!/usr/bin/env bash
# One device call: build, CUDA tests, the three modes and the PyTorch peers at gpt2 B=32.
set -uo pipefail
repo=$PWD
source scripts/gpu_cmake_args.sh
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > $OUT/nvidia.txt 2>&1
start=$SECONDS
cmake -S . -B build-gpu "${cmake_args[@]}" > $OUT/build.log 2>&1
cmake --build build-gpu -j16 --target layup layup_cuda_tests >> $OUT/build.log 2>&1 || { tail -50 $OUT/build.log; exit 1; }
echo "build $((SECONDS-start)) s"
timeout 150 build-gpu/layup_cuda_tests --gtest_brief=1 > $OUT/cuda_tests.log 2>&1; echo "cuda tests exit $? at $((SECONDS-start)) s"
grep -E "FAILED|PASSED|Failure" $OUT/cuda_tests.log | head -20
L=build-gpu/layup
b() { local name=$1; shift; timeout 100 $L bench --model gpt2 --batch 32 --seq-len 1024 --warmup 3 --steps 10 --json $OUT/$name.json "$@" > $OUT/$name.log 2>&1; echo "$name exit $? at $((SECONDS-start)) s"; grep -E "ms/step|tokens/s|CPU AdamW|memory peak" $OUT/$name.log | head -6; }
b gpu --mode gpu
b offload --mode offload
b layup --mode layup --trace $OUT/layup_trace.json
b layup_noclip --mode layup --clip none --trace $OUT/layup_noclip_trace.json
p() { local name=$1; shift; timeout 120 python3 bench/pytorch_offload_peer.py --model gpt2 --batch 32 --seq-len 1024 --warmup 3 --steps 10 --json $OUT/$name.json "$@" > $OUT/$name.log 2>&1; echo "$name exit $? at $((SECONDS-start)) s"; grep -E "ms/step|tokens/s|rror" $OUT/$name.log | head -4; }
p torch_gpu --mode gpu
p torch_offload --mode offload
p torch_layerwise --mode layerwise
