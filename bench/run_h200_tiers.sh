#!/usr/bin/env bash
# Issue 20 on the H200 machine: optimizer state split between the GPU and the host by the planner.
# One phase per device call (the build folder stays on the machine while it is held):
#   PHASE=build  builds layup and the CUDA tests (build-gpu, sm_90) and runs the tests
#   PHASE=big    the 13B-class GPT (L40 H40 C5120, T=1024) trained by `layup train` on the shipped
#                corpus in layup mode: the planner's split (`layup memory`), then 6 steps with exact
#                clipping, --recompute 3, no checkpoints; MFU per step from log.jsonl (6N + 12 L T C
#                FLOPs a token, the bench's count; recomputation not counted), peak host memory
#   PHASE=gpu    gpu mode at the 6.65B model (L32 H32 C4096) for the MFU it reaches, to compare
#   PHASE=curve  layup at gpt2-xl B=4 with --optimizer-placement device:K for K from 0 to 48: step
#                time against the device memory the plan needs; gpu mode beside it
# Logs go to $OUT (the device tool's output folder) or the build folder.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build-gpu
out=${OUT:-$build}
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"
layup=$build/layup

# Incremental where the machine still holds the build folder.
cmake -S "$repo" -B "$build" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
  cmake --build "$build" -j16 --target layup layup_cuda_tests > "$out/build.log" 2>&1
echo "build: exit $? after ${SECONDS}s"
"$layup" --version

# MFU of each step in a train log: the bench's FLOPs per token (6N + 12 L T C) at the H200's dense
# bf16 peak (989.4 TFLOP/s), and the step's tokens over its time.
mfu_of_log() {  # log.jsonl n_params n_layer seq_len n_embd tokens_per_step
  python3 - "$@" <<'EOF'
import json, sys
path, n, L, T, C, tokens = sys.argv[1], *map(int, sys.argv[2:])
flops_per_token = 6 * n + 12 * L * T * C
for line in open(path):
    row = json.loads(line)
    if "step_ms" in row:
        mfu = flops_per_token * tokens / (row["step_ms"] / 1e3) / 989.4e12
        print(f"step {row['step']}: loss {row['loss']:.4f}, {row['step_ms'] / 1e3:.2f} s, "
              f"{tokens / (row['step_ms'] / 1e3):,.0f} tok/s, MFU {100 * mfu:.1f}%, "
              f"peak device {row.get('peak_device_bytes', 0) / 2**30:.1f} GiB")
EOF
}

case "${PHASE:-build}" in
build)
  timeout 300 "$build/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
  echo "cuda tests: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
  grep -E "FAILED" "$out/cuda_tests.log" | head -n 20
  ;;
big)
  shape=(--layers 40 --heads 40 --dim 5120 --context 1024 --seq-len 1024 --batch "${BATCH:-8}"
    --grad-accum "${ACCUM:-16}" --mode layup --recompute 3 --clip 1.0 --layup-clip deferred)
  "$layup" memory "${shape[@]}" --device cuda > "$out/memory-13b.txt" 2>&1
  grep -E "note: layup keeps|budget|host memory at the peak" "$out/memory-13b.txt"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  free -g | head -2
  run=/tmp/layup-13b
  rm -rf "$run"
  /usr/bin/time -v "$layup" train "${shape[@]}" --steps "${STEPS:-6}" --lr "${LR:-2e-4}" --min-lr 2e-5 --warmup 3 --eval-every 0 \
    --no-checkpoints --sample-tokens 0 --log-every 1 --out "$run" > "$out/train-13b.log" 2>&1
  echo "train: exit $?"
  grep -E "Maximum resident|Elapsed \(wall" "$out/train-13b.log"
  head -n 30 "$out/train-13b.log"
  cp "$run/log.jsonl" "$out/train-13b.jsonl"
  tokens=$((1024 * ${BATCH:-8} * ${ACCUM:-16}))
  mfu_of_log "$run/log.jsonl" 12848143360 40 1024 5120 "$tokens" | tee "$out/mfu-13b.txt"
  rm -rf "$run"
  ;;
gpu)
  for config in "1 0" "2 2"; do
    set -- $config
    "$layup" bench --layers 32 --heads 32 --dim 4096 --context 1024 --seq-len 1024 --batch "$1" --recompute "$2" \
      --mode gpu --clip 1.0 --warmup 2 --steps 5 --json "$out/gpu-6.65b-b$1.json" \
      > "$out/gpu-6.65b-b$1.log" 2>&1
    echo "gpu mode 6.65B B=$1 recompute $2: exit $?"
    grep -E "MFU|ms/step|tokens/s|memory peak" "$out/gpu-6.65b-b$1.log"
  done
  ;;
curve)
  "$layup" bench --model gpt2-xl --batch 4 --mode gpu --warmup 3 --steps 10 \
    --json "$out/curve-gpu.json" > "$out/curve-gpu.log" 2>&1
  echo "gpu: $(grep -E 'ms/step|MFU|memory peak' "$out/curve-gpu.log")"
  for blocks in 0 8 16 24 32 40 48; do
    placement=device:$blocks
    "$layup" memory --model gpt2-xl --batch 4 --seq-len 1024 --device cuda --mode layup \
      --optimizer-placement "$placement" > "$out/curve-memory-$blocks.txt" 2>&1
    "$layup" bench --model gpt2-xl --batch 4 --mode layup --optimizer-placement "$placement" \
      --warmup 3 --steps 10 --json "$out/curve-$blocks.json" > "$out/curve-$blocks.log" 2>&1
    echo "$placement: exit $?; $(grep -E 'ms/step|MFU|memory peak' "$out/curve-$blocks.log");" \
      "plan: $(grep -E 'total: device side' "$out/curve-memory-$blocks.txt" | head -n 1)"
  done
  ;;
esac
