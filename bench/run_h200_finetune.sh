#!/usr/bin/env bash
# Issues 43 and 44 on the H200 machine: the CUDA tests, the compact optimizer state's training
# quality against fp32 (layup) and against torchao's AdamW8bit (PyTorch), and `layup sample`'s
# speed against transformers' generate. Builds .carry/head.tar where there is one (made by
# `git archive --prefix=head/ HEAD > .carry/head.tar`: the committed tree, whatever is being
# edited), else the working tree, in /tmp/build-gpu; .carry (carried) also holds googletest, the
# static libraries and wheels/torchao-*.whl.
# Phases (one device call each; PHASES="build curves" runs several in one call):
#   build   layup and layup_cuda_tests for sm_90 (-j16), the CUDA tests run
#   curves  gpt2 (124M) on the shipped corpus, STEPS (2000) steps of 16x512 tokens, gpu mode,
#           --optimizer-state fp32, bf16, 8bit: log.jsonl of each under $OUT/curves
#   peer    bench/pytorch_optimizer_state_peer.py on the same shards: fp32 AdamW and torchao's
#           AdamW8bit, the same steps, batch and schedule: CSVs under $OUT/curves
#   quality curves and peer, all five runs at once on the one GPU (their losses, not their times)
#   llama8b Llama 3 8B's shape (random weights), T=2048, 2 x 8 micro-batches, layup mode,
#           --recompute 3, --device-budget 24G, --optimizer-state ${STATE:-8bit}: calibrated at
#           its shape, then per accumulation order (ACCUMULATE, both by default) `layup memory`
#           (the split and predicted step) and `layup bench` (1 warm-up, STEPS8B timed steps);
#           the planner's answer for a 64 GB host and for a 13B model at 24 GB
#   stream  the streamed-weights CUDA tests; Llama 3 8B (B=4 x 4) and the 13B shape (B=2 x 8, no
#           clip) on --device-budget 24G with --streamed-blocks auto: `layup memory`, `layup bench`
#           (run llama8b first on the same machine: its calibration gives the predictions)
#   sample  bench/sample_speed.sh's H200 comparison (Llama 3.2 1B shape, random weights)
# A machine that came back bare between calls builds first, unless .carry/bin holds layup and
# layup_cuda_tests built here (scripts/build_device_binary.sh). Logs go to $OUT.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/finetune}
mkdir -p "$out/curves"
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"
build=/tmp/build-gpu
tree=$repo
if [ -f "$repo/.carry/head.tar" ]; then
  [ -d /tmp/head ] || tar -xf "$repo/.carry/head.tar" -C /tmp
  tree=/tmp/head
fi
if [ -x "$repo/.carry/bin/layup" ] && [ -x "$repo/.carry/bin/layup_cuda_tests" ]; then
  mkdir -p "$build" && ln -sf "$repo/.carry/bin/layup" "$repo/.carry/bin/layup_cuda_tests" "$build/"
fi
# A carried binary does not sit beside its data: point it at the tree's tokenizer and corpus.
export LAYUP_DATA_DIR=${LAYUP_DATA_DIR:-$tree/data}
layup=$build/layup
steps=${STEPS:-2000}
# The quality run's shape: gpt2 small, 16 x 512 tokens a step, nanoGPT's learning rates.
recipe=(--batch 16 --seq-len 512 --steps "$steps" --lr 6e-4 --min-lr 6e-5 --warmup 100
  --eval-every 100 --eval-batches 8 --seed 1337)

ensure_built() {
  [ -x "$layup" ] && [ -x "$build/layup_cuda_tests" ] && return
  cmake -S "$tree" -B "$build" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
    cmake --build "$build" -j16 --target layup layup_cuda_tests > "$out/build.log" 2>&1
  echo "build: exit $? at ${SECONDS}s"
  grep -E "error|Error" "$out/build.log" | head -n 20
}

curve() {  # kind: layup's gpt2 run with --optimizer-state KIND
  "$layup" train --model gpt2 "${recipe[@]}" --mode gpu --optimizer-state "$1" \
    --no-checkpoints --sample-tokens 0 --overwrite --out "/tmp/curve-$1" \
    > "$out/curves/layup-$1.log" 2>&1
  echo "layup $1: exit $? at ${SECONDS}s; $(grep -E 'validation loss' "$out/curves/layup-$1.log" | tail -n 1)"
  cp "/tmp/curve-$1/log.jsonl" "$out/curves/layup-$1.jsonl"
}
peer_setup() {  # torchao where the machine lacks it; the shipped corpus's shards in $data
  python3 -c "import torchao" 2> /dev/null ||
    pip install --no-deps --target /tmp/pylib "$repo"/.carry/wheels/torchao-*.whl > "$out/pip.log" 2>&1
  export PYTHONPATH=/tmp/pylib${PYTHONPATH:+:$PYTHONPATH}
  data=$(ls -d "$HOME"/.cache/layup/shards/shipped-corpus-* 2> /dev/null | head -n 1)
  if [ -z "$data" ]; then  # a one-step run tokenizes the shipped corpus as the curves' runs do
    "$layup" train --model gpt2 --batch 1 --seq-len 64 --steps 1 --no-checkpoints \
      --sample-tokens 0 --overwrite --out /tmp/tokenize-run > "$out/tokenize.log" 2>&1
    data=$(ls -d "$HOME"/.cache/layup/shards/shipped-corpus-* | head -n 1)
  fi
}
peer() {  # optimizer: the PyTorch peer on the same shards
  python3 "$tree/bench/pytorch_optimizer_state_peer.py" --data "$data" --model gpt2 \
    --optimizer "$1" --batch 16 --seq-len 512 --steps "$steps" \
    --csv "$out/curves/torch-$1.csv" > "$out/curves/torch-$1.log" 2>&1
  echo "torch $1: exit $? at ${SECONDS}s; $(tail -n 1 "$out/curves/torch-$1.log")"
}

for phase in ${PHASES:-build}; do
  echo "=== $phase at ${SECONDS}s"
  case $phase in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
      ensure_built
      "$build/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
      echo "cuda tests: exit $? at ${SECONDS}s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
      grep -E "FAILED|Failure" "$out/cuda_tests.log" | head -n 30
      "$layup" --version
      ;;
    curves)
      ensure_built
      for kind in ${KINDS:-fp32 bf16 8bit}; do curve "$kind"; done
      ;;
    peer)
      peer_setup
      for optimizer in ${OPTIMIZERS:-adamw adamw8bit}; do peer "$optimizer"; done
      ;;
    quality)
      # curves and peer at once, every run its own process on the one GPU: a quality run's
      # figure is its loss, not its time, and the GPU is far from full at 16 x 512 tokens.
      ensure_built
      peer_setup
      pids=()
      for kind in ${KINDS:-fp32 bf16 8bit}; do curve "$kind" & pids+=($!); done
      for optimizer in ${OPTIMIZERS:-adamw adamw8bit}; do peer "$optimizer" & pids+=($!); done
      for pid in "${pids[@]}"; do wait "$pid"; done
      ;;
    llama8b)
      ensure_built
      shape=(--model llama-3-8b --batch 2 --seq-len 2048 --grad-accum 8 --mode layup --recompute 3
        --device-budget 24G --clip 1.0 --layup-clip deferred --optimizer-state "${STATE:-8bit}")
      "$layup" calibrate --model llama-3-8b --batch 2 --seq-len 2048 --recompute 3 \
        > "$out/calibrate-8b.txt" 2>&1 || echo "calibrate 8b: exit $?"
      for order in ${ACCUMULATE:-layer-major micro-batch-major}; do
        "$layup" memory "${shape[@]}" --accumulate "$order" --device cuda --explain \
          > "$out/memory-8b-$order.txt" 2>&1
        grep -E "note: layup keeps|host memory at the peak|predicted step  |budget:" "$out/memory-8b-$order.txt"
        /usr/bin/time -v "$layup" bench "${shape[@]}" --accumulate "$order" --steps "${STEPS8B:-3}" \
          --warmup 1 --json "$out/8b-$order.json" > "$out/bench-8b-$order.log" 2> "$out/time-8b-$order.txt"
        echo "8b bench $order: exit $? at ${SECONDS}s"
        tail -n 12 "$out/bench-8b-$order.log"
        grep -E "Maximum resident" "$out/time-8b-$order.txt"
      done
      # The 64 GB workstation and the 13B model at 24 GB: what the planner says (no run).
      "$layup" memory "${shape[@]}" --accumulate layer-major --host-budget 64G --device cuda \
        > "$out/memory-8b-host64.txt" 2>&1
      echo "8b at --host-budget 64G: exit $?; $(grep -E 'host memory at the peak|REFUSED|refused' "$out/memory-8b-host64.txt" | head -n 3)"
      "$layup" memory --layers 40 --heads 40 --dim 5120 --context 2048 --seq-len 2048 --batch 1 \
        --grad-accum 16 --mode layup --recompute 3 --device-budget 24G --clip 1.0 \
        --layup-clip deferred --optimizer-state 8bit --device cuda > "$out/memory-13b-24g.txt" 2>&1
      echo "13b at --device-budget 24G: exit $?; $(grep -E 'budget:|REFUSED|refused' "$out/memory-13b-24g.txt" | head -n 3)"
      ;;
    stream)
      # Streamed weights (--streamed-blocks auto): the CUDA tests that compare a streamed step with
      # a resident one, then Llama 3 8B at B=4 x 4 on 24 GB (auto streams 9 blocks) and the 13B
      # shape at B=2 x 8 without clipping (31 streamed; clipping needs more host than 128 GB).
      "$build/layup_cuda_tests" --gtest_filter='*Streamed*' > "$out/cuda_streamed.log" 2>&1
      echo "streamed CUDA tests: exit $? at ${SECONDS}s; $(grep -E '^\[  (PASSED|FAILED) ' "$out/cuda_streamed.log" | tr '\n' ' ')"
      for shape in "8b --model llama-3-8b --batch 4 --grad-accum 4 --clip 1.0 --layup-clip deferred" \
        "13b --layers 40 --heads 40 --dim 5120 --context 2048 --batch 2 --grad-accum 8 --clip none"; do
        set -- $shape
        name=$1
        shift
        args=("$@" --seq-len 2048 --mode layup --recompute 3 --device-budget 24G
          --optimizer-state "${STATE:-8bit}")
        "$layup" memory "${args[@]}" --device cuda > "$out/memory-stream-$name.txt" 2>&1
        grep -E "streamed blocks|predicted step  |budget:" "$out/memory-stream-$name.txt"
        /usr/bin/time -v "$layup" bench "${args[@]}" --steps "${STEPS8B:-2}" --warmup 1 \
          --json "$out/stream-$name.json" > "$out/bench-stream-$name.log" 2> "$out/time-stream-$name.txt"
        echo "stream $name: exit $? at ${SECONDS}s"
        grep -E "ms/step|MFU|predicted  " "$out/bench-stream-$name.log"
      done
      ;;
    sample)
      ensure_built
      # The model folder (2.5 GB) stays out of $out, which comes back from the machine.
      LAYUP_BIN=$layup OUT=/tmp/sample_speed "$tree/bench/sample_speed.sh" h200 2>&1 | tail -n 30
      cp /tmp/sample_speed/sample_speed_h200.json "$out/" 2> /dev/null
      ;;
  esac
done
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2> /dev/null
echo "done at ${SECONDS}s"
