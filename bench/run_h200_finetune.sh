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
#   llama8b Llama 3 8B's shape (random weights), T=2048, 2 x 8 micro-batches, layup mode,
#           --recompute 3, --device-budget 24G, --optimizer-state ${STATE:-8bit}: calibrated at
#           its shape, `layup memory` (the split and predicted step), `layup bench` (1 warm-up,
#           STEPS8B timed steps)
#   sample  bench/sample_speed.sh's H200 comparison (Llama 3.2 1B shape, random weights)
# A machine that came back bare between calls builds first. Logs go to $OUT.
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
      for kind in ${KINDS:-fp32 bf16 8bit}; do
        "$layup" train --model gpt2 "${recipe[@]}" --mode gpu --optimizer-state "$kind" \
          --no-checkpoints --sample-tokens 0 --overwrite --out "/tmp/curve-$kind" \
          > "$out/curves/layup-$kind.log" 2>&1
        echo "layup $kind: exit $? at ${SECONDS}s; $(grep -E 'validation loss' "$out/curves/layup-$kind.log" | tail -n 1)"
        cp "/tmp/curve-$kind/log.jsonl" "$out/curves/layup-$kind.jsonl"
      done
      ;;
    peer)
      python3 -c "import torchao" 2> /dev/null ||
        pip install --no-deps --target /tmp/pylib "$repo"/.carry/wheels/torchao-*.whl > "$out/pip.log" 2>&1
      export PYTHONPATH=/tmp/pylib${PYTHONPATH:+:$PYTHONPATH}
      data=$(ls -d "$HOME"/.cache/layup/shards/shipped-corpus-* | head -n 1)
      [ -n "$data" ] || { "$layup" tokenize > "$out/tokenize.log" 2>&1; data=$(ls -d "$HOME"/.cache/layup/shards/shipped-corpus-* | head -n 1); }
      for optimizer in ${OPTIMIZERS:-adamw adamw8bit}; do
        python3 "$tree/bench/pytorch_optimizer_state_peer.py" --data "$data" --model gpt2 \
          --optimizer "$optimizer" --batch 16 --seq-len 512 --steps "$steps" \
          --csv "$out/curves/torch-$optimizer.csv" > "$out/curves/torch-$optimizer.log" 2>&1
        echo "torch $optimizer: exit $? at ${SECONDS}s; $(tail -n 1 "$out/curves/torch-$optimizer.log")"
      done
      ;;
    llama8b)
      ensure_built
      shape=(--model llama-3-8b --batch 2 --seq-len 2048 --grad-accum 8 --mode layup --recompute 3
        --device-budget 24G --clip 1.0 --layup-clip deferred --optimizer-state "${STATE:-8bit}")
      "$layup" calibrate --model llama-3-8b --batch 2 --seq-len 2048 --recompute 3 \
        > "$out/calibrate-8b.txt" 2>&1 || echo "calibrate 8b: exit $?"
      "$layup" memory "${shape[@]}" --device cuda --explain > "$out/memory-8b.txt" 2>&1
      grep -E "note: layup keeps|host memory at the peak|predicted step  |budget:" "$out/memory-8b.txt"
      /usr/bin/time -v "$layup" bench "${shape[@]}" --steps "${STEPS8B:-3}" --warmup 1 \
        --json "$out/8b.json" > "$out/bench-8b.log" 2> "$out/time-8b.txt"
      echo "8b bench: exit $? at ${SECONDS}s"
      tail -n 25 "$out/bench-8b.log"
      grep -E "Maximum resident" "$out/time-8b.txt"
      ;;
    sample)
      ensure_built
      LAYUP_BIN=$layup OUT=$out "$tree/bench/sample_speed.sh" h200 2>&1 | tail -n 30
      ;;
  esac
done
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2> /dev/null
echo "done at ${SECONDS}s"
