#!/usr/bin/env bash
# The Llama family on one H200. PHASE names one phase or several, comma-separated, run in order in
# one device call (each phase fits in one 10-minute call on its own):
#   PHASE=build   configures and builds layup and layup_cuda_tests (build-gpu, sm_90) and runs the
#                 CUDA tests
#   PHASE=peer1b  `layup bench --model llama-3.2-1b --mode gpu` at B x 2048 beside
#                 bench/pytorch_llama_peer.py (transformers' LlamaForCausalLM, SDPA, bf16 autocast,
#                 fused AdamW), eager and compiled: tokens/s of each, MFU, the ratios
#   PHASE=big8b   Llama 3 8B in layup mode (exact clipping at 1.0, deferred; --recompute 3) at
#                 B x 2048: `layup memory` of that shape first, then `layup bench`: step time,
#                 MFU, peak memory
#
#   PHASE=build,peer1b bench/run_h200_llama.sh
#   PHASE=peer1b BATCH=16 PEER_MODES="compile" bench/run_h200_llama.sh
#
# Environment: BATCH (peer1b: 8, big8b: 4), SEQ_LEN (2048), WARMUP (peer1b: 3, big8b: 1), STEPS
# (peer1b: 10, big8b: 3), PEER_MODES (which of "eager compile" to run; both), PYTHON (python3, the
# one with torch and transformers), BUILD (build-gpu in the repository), LAYUP_BIN (a layup built
# already: no build), LAYUP_ARGS (more flags for every `layup bench`), BUDGET_S (570: the whole
# call's wall-clock budget; every command runs under `timeout` with what is left, at most
# COMMAND_LIMIT_S, 300, each). Logs and JSON results go to $OUT (the device tool's output folder),
# else the build folder. Dependencies come from .carry/ as in src/backend/cuda/run_gpu_tests.sh.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$repo/build-gpu}
out=${OUT:-$build}
seq_len=${SEQ_LEN:-2048}
python=${PYTHON:-python3}
budget_s=${BUDGET_S:-570}
command_limit_s=${COMMAND_LIMIT_S:-300}
peer_modes=${PEER_MODES:-"eager compile"}
layup=${LAYUP_BIN:-$build/layup}
read -r -a layup_args <<< "${LAYUP_ARGS:-}"
mkdir -p "$build" "$out"
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"

# Seconds left for a command: the budget minus what has run, less a margin for the summaries.
left() { echo $((budget_s - SECONDS - 10)); }

run_timed() {  # log name, command...: under timeout with what is left; output into $out/NAME.log
  local name=$1
  shift
  local limit
  limit=$(left)
  [ "$limit" -gt "$command_limit_s" ] && limit=$command_limit_s
  if [ "$limit" -lt 20 ]; then
    echo "=== $name: skipped, the budget is spent"
    return 1
  fi
  echo "=== $name (timeout ${limit} s): $*"
  local started=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local result=$?
  echo "=== $name: exit $result after $((SECONDS - started)) s (log: $out/$name.log)"
  [ $result -eq 0 ] || tail -n 15 "$out/$name.log"
  return $result
}

# One line per JSON result: tokens/s, median ms/step, MFU, peak memory; then the ratios of the
# first (layup) to each of the others.
summarize() {  # json files...
  "$python" - "$@" <<'PY'
import json, os, sys

results = []
for path in sys.argv[1:]:
    if os.path.exists(path):
        with open(path) as f:
            results.append(json.load(f))
    else:
        print(f"  {os.path.basename(path)}: no result")

def peak_gib(r):
    if r["engine"] == "layup":  # the whole GPU in use after each step, max; layup's own peak
        own = r["memory"]["measured"]["device_side"]["peak_bytes"]
        return f"{r['memory_peak_bytes'] / 2**30:.1f} GiB whole GPU, {own / 2**30:.1f} GiB layup's"
    return (f"{r['memory_device_used_peak_bytes'] / 2**30:.1f} GiB whole GPU, "
            f"{r['memory_peak_bytes'] / 2**30:.1f} GiB torch allocated")

for r in results:
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
    print(f"  {r['engine']:<16} {r['model']} B={r['batch']} T={r['seq_len']}: "
          f"{r['tokens_per_s']:,.0f} tokens/s, median {r['median_ms']:.1f} ms/step, MFU {mfu}, "
          f"{peak_gib(r)}, last loss {r['last_loss']:.4f}")
if len(results) > 1 and results[0]["engine"] == "layup":
    for r in results[1:]:
        print(f"  layup / {r['engine']}: {results[0]['tokens_per_s'] / r['tokens_per_s']:.2f}x")
PY
}

phases=${PHASE:-build}
for phase in ${phases//,/ }; do
case "$phase" in
build)
  if [ -n "${LAYUP_BIN:-}" ]; then
    echo "=== no build: LAYUP_BIN=$layup"
  else
    run_timed configure cmake -S "$repo" -B "$build" "${cmake_args[@]}" &&
      run_timed build cmake --build "$build" -j"$(nproc)" --target layup layup_cuda_tests
    "$layup" --version
    run_timed cuda_tests "$build/layup_cuda_tests" --gtest_brief=1
    echo "cuda tests: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
    grep -E "FAILED" "$out/cuda_tests.log" | head -n 20
  fi
  ;;
peer1b)
  batch=${BATCH:-8}
  common=(--model llama-3.2-1b --seq-len "$seq_len" --batch "$batch" --warmup "${WARMUP:-3}"
    --steps "${STEPS:-10}")
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  jsons=("$out/peer1b-layup.json")
  run_timed peer1b-layup "$layup" bench "${common[@]}" --mode gpu --device cuda --dtype bf16 \
    "${layup_args[@]}" --json "$out/peer1b-layup.json"
  for peer in $peer_modes; do
    flag=()
    [ "$peer" = compile ] && flag=(--compile)
    jsons+=("$out/peer1b-$peer.json")
    run_timed "peer1b-$peer" "$python" "$repo/bench/pytorch_llama_peer.py" "${common[@]}" \
      --device cuda "${flag[@]}" --json "$out/peer1b-$peer.json"
  done
  summarize "${jsons[@]}"
  ;;
big8b)
  batch=${BATCH:-4}
  shape=(--model llama-3-8b --seq-len "$seq_len" --batch "$batch" --mode layup --clip 1.0
    --layup-clip deferred --recompute 3)
  free -g | head -n 2
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
  run_timed big8b-memory "$layup" memory "${shape[@]}" --device cuda
  grep -E "total device|total host|host memory at the peak|optimizer state|on this machine|error" \
    "$out/big8b-memory.log" | head -n 12
  run_timed big8b-bench /usr/bin/time -v "$layup" bench "${shape[@]}" --device cuda --dtype bf16 \
    --warmup "${WARMUP:-1}" --steps "${STEPS:-3}" "${layup_args[@]}" \
    --json "$out/big8b-layup.json"
  grep -E "ms/step|MFU|memory peak|floor|clipped|Maximum resident" "$out/big8b-bench.log"
  summarize "$out/big8b-layup.json"
  ;;
*)
  echo "unknown PHASE '$phase' (build, peer1b, big8b)"
  exit 2
  ;;
esac
done
echo "total: $SECONDS s; logs in $out"
