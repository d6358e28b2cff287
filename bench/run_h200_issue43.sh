#!/usr/bin/env bash
# Issue 43's runs on the H200 machine: training on the GPUs people own, each figure against the
# step-time model's prediction (`layup calibrate` at the run's shape first). Binaries built here
# and carried in .carry/bin (TARGETS="layup layup_cuda_tests" scripts/build_device_binary.sh);
# .carry/wheels holds torchao's wheel for the peer. Logs and a summary line per run go to $OUT.
# Phases (PHASES="8b 13b" runs several in one call):
#   tests   the CUDA tests
#   8b      Llama 3 8B, T=2048, B=2, 8-bit moments, clip 1.0 deferred, --device-budget 24G, at
#           --grad-accum in ACCUMS (8 16: global batches of 16 and 32 x 2048 tokens)
#   host64  the same at --grad-accum 8 with --host-budget 64G and the disk (--offload-dir), with
#           --clip in CLIPS (none 1.0; none: fewer blocks on disk, no whole gradient on the
#           host), calibrated with the disk first
#   13b     Llama 2 13B's shape, T=2048, B=2 x 8, 8-bit, --clip none, --device-budget 24G
#   box     the largest GPT of BOX_LAYERS (96: 30.5B, H40 C5120, T=1024, B=16) on the whole box:
#           141 GB GPU, the host, the disk; 8-bit moments, --clip none
#   peer    PyTorch + torchao's CPUOffloadOptimizer on Llama 3 8B, B=2 x 2048, 24 GiB
#           (bench/pytorch_llama_peer.py --cpu-offload)
#   trace8b one step of the 8b run at --grad-accum 8 under --trace (trace-8b.json)
set -uo pipefail
# shellcheck source=bench/wait_for_free_gpu.sh
source "$(dirname "$0")/wait_for_free_gpu.sh"

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/issue43}
mkdir -p "$out"
layup=${LAYUP_BIN:-$repo/.carry/bin/layup}
tests=${LAYUP_TESTS_BIN:-$repo/.carry/bin/layup_cuda_tests}
offload=/tmp/layup-offload
steps=${STEPS:-2}

summary() {  # name json: one line of the bench's JSON (ms, MFU, prediction, memory)
  python3 - "$1" "$2" <<'EOF'
import json, sys
name, path = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
except Exception as error:
    print(f"{name}: no result ({error})")
    sys.exit(0)
steps = sorted(r.get("step_ms") or [0])
median = steps[len(steps) // 2]
predicted = r.get("predicted") or {}
gib = lambda b: (b or 0) / 2**30
accounted = (((r.get("memory") or {}).get("measured") or {}).get("total") or {}).get("peak_bytes")
print(f"{name}: median {median:,.0f} ms of {len(steps)} ({', '.join(f'{s:,.0f}' for s in steps)}), "
      f"{r.get('tokens_per_s', 0):,.0f} tok/s, MFU {100 * (r.get('mfu') or 0):.1f}%, "
      f"predicted {predicted.get('predicted_ms', 0):,.0f} ms (measured/predicted "
      f"{predicted.get('measured_over_predicted', 0):.2f}), device peak {gib(r.get('memory_peak_bytes')):.2f} GiB "
      f"(before the run {gib(r.get('memory_before_bytes')):.2f}, accountant's peak "
      f"{gib(accounted):.2f}), last loss {r.get('last_loss')}")
EOF
}

run() {  # name, layup bench arguments...: `layup memory`, then the bench under /usr/bin/time
  local name=$1
  shift
  local planned=() skip=0
  for arg in "$@"; do  # `layup memory` takes the run's flags but not the bench's own
    if [ $skip = 1 ]; then skip=0; continue; fi
    case $arg in --steps | --warmup) skip=1 ;; *) planned+=("$arg") ;; esac
  done
  # --no-checkpoints: a bench writes none, so its plan leaves out the writer's scratch
  "$layup" memory "${planned[@]}" --device cuda --no-checkpoints --explain \
    > "$out/memory-$name.txt" 2>&1
  grep -E "budget:|predicted step  |layup keeps|streamed blocks  " "$out/memory-$name.txt" | cut -c1-220
  /usr/bin/time -v "$layup" bench "$@" --json "$out/$name.json" > "$out/bench-$name.log" \
    2> "$out/time-$name.txt"
  echo "$name: exit $? at ${SECONDS}s; host peak $(grep -E 'Maximum resident' "$out/time-$name.txt" | awk '{printf "%.1f GiB", $6 / 1048576}')"
  summary "$name" "$out/$name.json" | tee -a "$out/summary.txt"
}

llama8b_shape=(--model llama-3-8b --batch 2 --seq-len 2048 --mode layup --recompute 3
  --device-budget 24G --optimizer-state 8bit)
llama8b=("${llama8b_shape[@]}" --clip 1.0 --layup-clip deferred)

nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
"$layup" --version
for phase in ${PHASES:-tests}; do
  echo "=== $phase at ${SECONDS}s"
  wait_for_free_gpu
  case $phase in
    tests)
      "$tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
      echo "cuda tests: exit $? at ${SECONDS}s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
      grep -E "FAILED|Failure" "$out/cuda_tests.log" | head -n 30
      ;;
    8b | host64 | trace8b)
      [ -f "$out/calibrate-8b.txt" ] || [ "$phase" = host64 ] ||
        "$layup" calibrate --model llama-3-8b --batch 2 --seq-len 2048 --recompute 3 \
          > "$out/calibrate-8b.txt" 2>&1 || echo "calibrate 8b: exit $?"
      case $phase in
        8b) for accum in ${ACCUMS:-8 16}; do
              run "8b-x$accum" "${llama8b[@]}" --grad-accum "$accum" --steps "$steps" --warmup 1
            done ;;
        host64)
          mkdir -p "$offload"
          "$layup" calibrate --model llama-3-8b --batch 2 --seq-len 2048 --recompute 3 \
            --offload-dir "$offload" > "$out/calibrate-8b-disk.txt" 2>&1 ||
            echo "calibrate 8b with the disk: exit $?"
          for clip in ${CLIPS:-none 1.0}; do
            clipping=(--clip "$clip")
            [ "$clip" = none ] || clipping+=(--layup-clip deferred)
            run "8b-host64-clip-$clip" "${llama8b_shape[@]}" "${clipping[@]}" --grad-accum 8 \
              --host-budget 64G --offload-dir "$offload" --steps "$steps" --warmup 1
            rm -rf "${offload:?}"/*
          done
          rm -rf "$offload" ;;
        trace8b)
          "$layup" bench "${llama8b[@]}" --grad-accum 8 --steps 1 --warmup 1 \
            --trace "$out/trace-8b.json" > "$out/bench-trace8b.log" 2>&1
          echo "trace8b: exit $? at ${SECONDS}s; $(grep -E 'ms/step|MFU' "$out/bench-trace8b.log" | head -n 2 | tr '\n' ' ')" ;;
      esac
      ;;
    13b)
      "$layup" calibrate --model llama-2-13b --batch 2 --seq-len 2048 --recompute 3 \
        > "$out/calibrate-13b.txt" 2>&1 || echo "calibrate 13b: exit $?"
      run 13b-24g --model llama-2-13b --batch 2 --seq-len 2048 --grad-accum 8 --mode layup \
        --recompute 3 --device-budget 24G --clip none --optimizer-state 8bit --steps "$steps" \
        --warmup 1
      ;;
    box)
      layers=${BOX_LAYERS:-96}
      "$layup" calibrate --layers "$layers" --heads 40 --dim 5120 --context 1024 --batch 16 \
        --recompute 3 > "$out/calibrate-box.txt" 2>&1 || echo "calibrate box: exit $?"
      mkdir -p "$offload"
      run "box-l$layers" --layers "$layers" --heads 40 --dim 5120 --context 1024 --seq-len 1024 \
        --batch 16 --mode layup --recompute 3 --clip none --optimizer-state 8bit \
        --offload-dir "$offload" --steps "${BOX_STEPS:-1}" --warmup 1
      rm -rf "$offload"
      ;;
    peer)
      python3 -c "import torchao" 2> /dev/null ||
        pip install --no-deps --target /tmp/pylib "$repo"/.carry/wheels/torchao-*.whl > "$out/pip.log" 2>&1
      PYTHONPATH=/tmp/pylib${PYTHONPATH:+:$PYTHONPATH} python3 "$repo/bench/pytorch_llama_peer.py" \
        --model llama-3-8b --batch 2 --seq-len 2048 --cpu-offload --device-budget 24 --warmup 1 \
        --steps "$steps" --json "$out/peer-8b.json" > "$out/peer-8b.log" 2>&1
      echo "peer: exit $? at ${SECONDS}s"
      tail -n 14 "$out/peer-8b.log"
      ;;
  esac
done
echo "done at ${SECONDS}s"
