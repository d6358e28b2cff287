#!/usr/bin/env bash
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
start=$SECONDS
repo=$PWD; source scripts/gpu_cmake_args.sh
cmake --build build-gpu -j16 --target layup > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS-start)) s"
L=build-gpu/layup
mkdir -p $OUT/r
b() { local name=$1; shift; timeout 100 $L bench --model gpt2 --batch 32 --seq-len 1024 --warmup 3 --steps 10 --json $OUT/r/$name.json "$@" > $OUT/r/$name.log 2>&1; echo "$name exit $? at $((SECONDS-start)) s"; grep -E "ms/step|CPU AdamW" $OUT/r/$name.log | head -3; }
b layup_w16 --mode layup --trace $OUT/r/layup_w16_trace.json
b layup_w14 --mode layup --cpu-workers 14 --trace $OUT/r/layup_w14_trace.json
b layup_noclip_w16 --mode layup --clip none --trace $OUT/r/layup_noclip_w16_trace.json
b layup_noclip_w14 --mode layup --clip none --cpu-workers 14 --trace $OUT/r/layup_noclip_w14_trace.json
b offload_w14 --mode offload --cpu-workers 14
cd $OUT && tar czf r.tgz r && rm -rf r
