#!/usr/bin/env bash
# Issue 20 on the H200 machine: optimizer state split between the GPU and the host by the planner.
# PHASE names one phase or several, comma-separated, run in order in one device call:
#   PHASE=build  builds layup and the CUDA tests (build-gpu, sm_90) and runs the tests
#   PHASE=big    the 13B-class GPT (L40 H40 C5120, T=1024) trained by `layup train` on the shipped
#                corpus in layup mode, B=32 x 4 and lr 3e-5 (the headline's; BATCH, ACCUM, LR;
#                B=16 x 8 ran at 34.4% MFU in run 2026-12-03d, B=32 x 4 at 50.8% in 2026-12-03e):
#                calibrated at that shape, the planner's split and predicted step (`layup
#                memory`), then 6 steps with exact clipping,
#                --recompute 3; MFU per step from log.jsonl (6N + 12 L T C FLOPs a token, the
#                bench's count; recomputation not counted), peak host memory; at its end the
#                weights alone as sharded safetensors (--checkpoint-contents weights), resident
#                memory sampled every 0.5 s during the write (the checkpoint line of "at scale")
#   PHASE=gpu    gpu mode at the 6.65B model (L32 H32 C4096) for the MFU it reaches, to compare,
#                at B=1 and at B=2 with --recompute 2, each calibrated at its shape first
#   PHASE=curve  layup at gpt2-xl B=4 with --optimizer-placement device:K for K from 0 to 48: step
#                time against the device memory the plan needs; gpu mode beside it. Calibrated
#                once at its start, as a user would: each bench prints the step-time model's
#                prediction from that calibration beside the measured median
#   PHASE=ckpt   checkpoints at scale (the 13B weights are `big`'s): a 3.88B model's full state
#                written, then resumed, its next loss beside an uninterrupted run's; resident memory
#                sampled every 0.5 s during each write
#   PHASE=disk   the disk tier: calibrate with the disk, then `layup bench` of the largest GPT the
#                planner admits with blocks on disk (L=$DISK_LAYERS, default 58: 18.5B) at B=16,
#                --clip none, --optimizer-placement auto --offload-dir; prediction beside measured
#   PHASE=largest  the largest GPT (H40 C5120, T=1024, L descending by 2 from $FROM) each of
#                $MODES trains on this box: every plan over a limit is refused before allocating,
#                so the scan costs only the first L that fits, which `layup bench` then times
#                (1 warm-up + 1 step), calibrated once per mode first; modes: gpu, offload, layup,
#                layup-disk (--clip none, --offload-dir); MFU from the bench. MODES="gpu:26 layup:50" starts each mode's
#                scan at its own L
# Every line of the issue in three calls (each under the 10-minute limit), with LAYUP_BIN; in run
# 2026-12-04b they took 556, 539 and 519 s, 1,721 s of device time with two fresh starts:
#   PHASE=curve,ckpt,largest MODES="offload:24"   (CUDA tests before it)  556 s
#   PHASE=big,gpu,largest MODES="gpu:26"                                  539 s
#   PHASE=disk,largest STEPS=1 MODES="layup:44"                           519 s
# Logs go to build-gpu/logs; after each phase bench/tiers_table.py writes the issue's table from all
# of them (table.md, and curve.csv for bench/plot_tier_curve.py), so a warm machine's calls add up
# to one table, and they are packed into $OUT/logs.tar.gz where $OUT is set (the device tool's
# output folder brings back at most 8 files).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build-gpu
out=$build/logs
mkdir -p "$out"
pack_logs() { [ -z "${OUT:-}" ] || tar -C "$out" -czf "$OUT/logs.tar.gz" .; }
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"
layup=${LAYUP_BIN:-$build/layup}

# Incremental where the machine still holds the build folder; the CUDA tests only where a phase
# runs them (they add about a minute to a fresh build). LAYUP_BIN names a layup built elsewhere
# (scripts/build_device_binary.sh), which saves a fresh machine's ~200 s build.
if [ -z "${LAYUP_BIN:-}" ]; then
  targets=(layup)
  [[ ",$PHASE," == *,build,* ]] && targets+=(layup_cuda_tests)
  cmake -S "$repo" -B "$build" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
    cmake --build "$build" -j16 --target "${targets[@]}" > "$out/build.log" 2>&1
  echo "build: exit $? after ${SECONDS}s"
else
  export LAYUP_DATA_DIR=${LAYUP_DATA_DIR:-$repo/data}  # the binary knows its build tree's path
fi
"$layup" --version || exit 1

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

# Resident memory of the newest layup process every 0.5 s, with the time, until it is killed; and
# each line of a command's output with the time it came (a checkpoint's write is the stretch before
# its "checkpoint ... GB in S s" line).
sample_rss() {  # file
  while sleep 0.5; do
    pid=$(pgrep -n -x layup) || continue
    echo "$(date +%s.%N) $(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)"
  done > "$1"
}
stamp() { while IFS= read -r line; do echo "$(date +%s.%N) $line"; done; }

for phase in ${PHASE//,/ }; do
case "$phase" in
build)
  timeout 200 "$build/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
  echo "cuda tests: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
  grep -E "FAILED" "$out/cuda_tests.log" | head -n 20
  ;;
big)
  shape=(--layers 40 --heads 40 --dim 5120 --context 1024 --seq-len 1024 --batch "${BATCH:-32}"
    --grad-accum "${ACCUM:-4}" --mode layup --recompute 3 --clip 1.0 --layup-clip deferred)
  # The rates at this shape first (~20 s), so `layup memory` predicts the step beside the run.
  "$layup" calibrate --layers 40 --heads 40 --dim 5120 --context 1024 --batch "${BATCH:-32}" \
    --recompute 3 > "$out/calibrate-13b.txt" 2>&1
  echo "calibrate: exit $?"
  "$layup" memory "${shape[@]}" --device cuda > "$out/memory-13b.txt" 2>&1
  grep -E "note: layup keeps|budget|host memory at the peak|predicted step  " "$out/memory-13b.txt"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
  free -g | head -2
  run=/tmp/layup-13b
  rm -rf "$run"
  sample_rss "$out/rss-13b.txt" & sampler=$!
  /usr/bin/time -v "$layup" train "${shape[@]}" --steps "${STEPS:-6}" --lr "${LR:-3e-5}" --min-lr 2e-5 --warmup 3 --eval-every 0 \
    --checkpoint-contents weights --sample-tokens 0 --log-every 1 --trace "$out/trace-13b.json" \
    --out "$run" 2>&1 | stamp \
    > "$out/train-13b.log"
  echo "train: exit ${PIPESTATUS[0]}"
  kill "$sampler"
  grep -E "Maximum resident|Elapsed \(wall|checkpoint .* GB in" "$out/train-13b.log"
  ls -la "$run"/step-*/ | head -n 20
  head -n 30 "$out/train-13b.log"
  cp "$run/log.jsonl" "$out/train-13b.jsonl"
  tokens=$((1024 * ${BATCH:-32} * ${ACCUM:-4}))
  mfu_of_log "$run/log.jsonl" 12848143360 40 1024 5120 "$tokens" | tee "$out/mfu-13b.txt"
  rm -rf "$run"
  ;;
gpu)
  for config in "1 0" "2 2"; do
    set -- $config
    # Calibrated at this shape first: predicted from the 13B's FLOP rate (C=5120, B=32) the step
    # ran 1.20-1.23x its prediction (runs 2026-12-03e, 2026-12-04a).
    "$layup" calibrate --layers 32 --heads 32 --dim 4096 --context 1024 --batch "$1" \
      --recompute "$2" > "$out/calibrate-gpu-6.65b-b$1.txt" 2>&1
    "$layup" bench --layers 32 --heads 32 --dim 4096 --context 1024 --seq-len 1024 --batch "$1" --recompute "$2" \
      --mode gpu --clip 1.0 --warmup 2 --steps 5 --json "$out/gpu-6.65b-b$1.json" \
      > "$out/gpu-6.65b-b$1.log" 2>&1
    echo "gpu mode 6.65B B=$1 recompute $2: exit $?"
    grep -E "MFU|ms/step|tokens/s|memory peak" "$out/gpu-6.65b-b$1.log"
  done
  ;;
curve)
  "$layup" calibrate --model gpt2-xl --batch 4 > "$out/calibrate-gpt2-xl.txt" 2>&1
  echo "calibrate: exit $?"; cat "$out/calibrate-gpt2-xl.txt" | tail -n 12
  "$layup" bench --model gpt2-xl --batch 4 --mode gpu --warmup 2 --steps 6 \
    --json "$out/curve-gpu.json" > "$out/curve-gpu.log" 2>&1
  echo "gpu: $(grep -E 'ms/step|MFU|memory peak' "$out/curve-gpu.log")"
  for blocks in 0 12 24 36 48; do
    placement=device:$blocks
    # No calibration per point: one calibration in six of run 2026-12-04b timed the CPU's AdamW
    # 1.25-1.4x faster than the five around it and than the steps after it; its point missed by
    # 1.25x; one calibration for the curve is what a user's run would predict from.
    "$layup" memory --model gpt2-xl --batch 4 --seq-len 1024 --device cuda --mode layup \
      --optimizer-placement "$placement" > "$out/curve-memory-$blocks.txt" 2>&1
    "$layup" bench --model gpt2-xl --batch 4 --mode layup --layup-clip deferred \
      --optimizer-placement "$placement" \
      --warmup 2 --steps 6 --json "$out/curve-$blocks.json" > "$out/curve-$blocks.log" 2>&1
    echo "$placement: exit $?; $(grep -E 'ms/step|MFU|memory peak|predicted' "$out/curve-$blocks.log");" \
      "plan: $(grep -E 'total: device side' "$out/curve-memory-$blocks.txt" | head -n 1)"
  done
  ;;
ckpt)
  df -h /tmp | tail -n 1
  run=/tmp/layup-ckpt
  rm -rf "$run"
  shape4=(--layers 24 --heads 28 --dim 3584 --context 1024 --seq-len 1024 --batch 8 --mode layup
    --clip 1.0 --lr 3e-5 --min-lr 3e-6 --warmup 1 --eval-every 0 --sample-tokens 0 --log-every 1)
  "$layup" train "${shape4[@]}" --steps 2 --no-checkpoints --out /tmp/layup-straight \
    > "$out/train-3.9b-straight.log" 2>&1
  echo "3.9B straight: exit $?; $(grep -E '^step [0-9]+/' "$out/train-3.9b-straight.log" | tr '\n' ' ')"
  cp /tmp/layup-straight/log.jsonl "$out/train-3.9b-straight.jsonl"  # every digit of each step
  rm -rf /tmp/layup-straight
  sample_rss "$out/rss-3.9b.txt" & sampler=$!
  "$layup" train "${shape4[@]}" --steps 2 --until-step 1 --keep-checkpoints 1 --out "$run" 2>&1 |
    stamp > "$out/train-3.9b-first.log"
  echo "3.9B first step + full checkpoint: exit ${PIPESTATUS[0]}"
  kill "$sampler"
  grep -E "checkpoint|error|^[0-9.]+ step [0-9]+/" "$out/train-3.9b-first.log" | tail -n 4
  du -sh "$run"/step-*
  sample_rss "$out/rss-3.9b-resume.txt" & sampler=$!
  "$layup" train --resume "$run" --no-checkpoints 2>&1 | stamp > "$out/train-3.9b-resumed.log"
  echo "3.9B resumed: exit ${PIPESTATUS[0]}"
  kill "$sampler"
  grep -E "resum|error|^[0-9.]+ step [0-9]+/" "$out/train-3.9b-resumed.log" | tail -n 4
  cp "$run/log.jsonl" "$out/train-3.9b-resumed.jsonl"
  rm -rf "$run"
  ;;
disk)
  dir=/tmp/layup-offload
  mkdir -p "$dir"
  df -h /tmp | tail -n 1
  free -g | head -n 2
  L=${DISK_LAYERS:-58}
  shape=(--layers "$L" --heads 40 --dim 5120 --context 1024 --seq-len 1024 --batch "${BATCH:-16}"
    --mode layup --recompute 3 --clip none --offload-dir "$dir")
  "$layup" calibrate --layers "$L" --heads 40 --dim 5120 --context 1024 --batch "${BATCH:-16}" \
    --recompute 3 --offload-dir "$dir" --disk-gib "${DISK_GIB:-4}" > "$out/calibrate-disk.txt" 2>&1
  echo "calibrate: exit $?"; tail -n 12 "$out/calibrate-disk.txt"
  "$layup" memory "${shape[@]}" --device cuda > "$out/memory-disk.txt" 2>&1
  grep -E "optimizer state  |on disk|predicted|step" "$out/memory-disk.txt" | head -n 20
  /usr/bin/time -v "$layup" bench "${shape[@]}" --warmup 1 --steps "${STEPS:-2}" \
    --json "$out/bench-disk.json" > "$out/bench-disk.log" 2>&1
  echo "bench: exit $?"
  grep -E "set-up: (alloc|fresh)|ms/step|MFU|predicted|memory peak|Maximum resident|disk|error" \
    "$out/bench-disk.log" | head -n 30
  rm -rf "$dir"
  ;;
largest)
  mkdir -p /tmp/layup-offload
  for entry in ${MODES:-gpu offload layup}; do
    mode=${entry%%:*} from=${FROM:-60}
    [ "$entry" = "$mode" ] || from=${entry#*:}
    extra=(--mode "$mode" --clip 1.0 --recompute 3)
    disk=()
    case $mode in
    layup) extra+=(--batch 16 --layup-clip deferred) ;;
    layup-disk) extra=(--mode layup --clip none --recompute 3 --batch 16
      --offload-dir /tmp/layup-offload)
      disk=(--offload-dir /tmp/layup-offload --disk-gib 2) ;;
    *) extra+=(--batch 4) ;;
    esac
    batch=4
    [[ " ${extra[*]} " == *" --batch 16 "* ]] && batch=16
    # Calibrated at this shape before the scan, for the prediction beside the bench: the
    # calibration cuts the model to 2 and 4 blocks, so its rates do not depend on L, and a refused
    # L costs a second, not a calibration's 20 s.
    "$layup" calibrate --layers "$from" --heads 40 --dim 5120 --context 1024 --batch "$batch" \
      --recompute 3 "${disk[@]}" > "$out/calibrate-largest-$mode.txt" 2>&1
    for ((L = from; L >= 8; L -= 2)); do
      timeout 400 "$layup" bench --layers "$L" --heads 40 --dim 5120 --context 1024 --seq-len 1024 \
        "${extra[@]}" --warmup 1 --steps 1 --json "$out/largest-$mode-$L.json" \
        > "$out/largest-$mode-$L.log" 2>&1
      status=$?
      if [ $status -eq 0 ]; then
        echo "$mode: L=$L $(grep -E '^  (ms/step|MFU|predicted) |note: layup keeps' "$out/largest-$mode-$L.log" | tr '\n' ' ')"
        break
      fi
      grep -qE "needs .* over|refused|does not fit" "$out/largest-$mode-$L.log" || {
        echo "$mode: L=$L failed (exit $status), not a refusal:"; tail -n 3 "$out/largest-$mode-$L.log"; break; }
      # The last refusal stays, for the table: why the next larger L did not fit.
      rm -f "$out/largest-$mode-refused-"*.txt
      grep -m 1 "error:" "$out/largest-$mode-$L.log" > "$out/largest-$mode-refused-$L.txt"
      rm -f "$out/largest-$mode-$L.log"
    done
  done
  rm -rf /tmp/layup-offload
  ;;
esac
# The issue's table over every phase this machine has run so far (its logs add up across calls).
python3 "$repo/bench/tiers_table.py" "$out" "$out/curve.csv" > "$out/table.md" || echo "table: failed"
pack_logs
done
cat "$out/table.md"
