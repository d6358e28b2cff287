#!/usr/bin/env bash
# What a run may hold on the H200 machine, in one call (issue 18): builds layup with the CUDA
# backend for sm_90 (dependencies from .carry/, scripts/make_device_carry.sh) and runs the CUDA
# tests, then
#   1. the 6.65B model (L32 H32 C4096, B=1, T=1024, --clip none) in layup mode: refused before
#      allocating, or trained if the plan finds it fits; never ended by the kernel (the exit status
#      and the peak resident set are recorded);
#   2. small CUDA runs in gpu and layup mode: the peak resident set (VmHWM) against the plan's host
#      memory at its peak (what the plan allows for the CUDA runtime and libraries);
#   3. SIGTERM during a CUDA layup run: the step finishes, a checkpoint is written, exit 0, and
#      `--resume` alone continues the run;
#   4. the README's `layup bench --model gpt2 --batch 32 --seq-len 1024`, which a 24 GB machine
#      refuses, runs here;
#   5. gpt2-xl at B=64, over the GPU's free memory: refused before allocating.
# Logs go to $OUT (the device tool's output folder) or the build folder; summary.txt has one line
# per check.
#   bench/run_h200_limits.sh          (BUILD: build folder, default build-gpu)
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
export BUILD=${BUILD:-$repo/build-gpu}
out=${OUT:-$BUILD}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"
cmake -S "$repo" -B "$BUILD" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target layup layup_cuda_tests > "$out/build.log" 2>&1
note "cuda build: exit $? (configure.log, build.log)"
"$BUILD/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
note "cuda tests: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
layup=$BUILD/layup
[ -x "$layup" ] || { note "no layup binary: stopping"; exit 1; }
note "layup: $("$layup" --version)"
free -g | tee -a "$summary"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a "$summary"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A run under /usr/bin/time: its exit status and peak resident set go to the summary.
timed() {  # name, timeout_s, layup arguments...
  local name=$1 limit=$2
  shift 2
  /usr/bin/time -f "%M" -o "$work/$name.rss" timeout "$limit" "$layup" "$@" > "$out/$name.log" 2>&1
  local status=$?
  note "$name: exit $status, peak resident set $(($(tail -n 1 "$work/$name.rss") / 1024)) MiB"
  grep -E "layup: error|host memory at the peak|process peak resident set|trained to step" \
    "$out/$name.log" | head -n 4 | sed 's/^/    /' | tee -a "$summary"
}

# 1. The 6.65B model in layup mode.
timed layup-6.65b 420 train --layers 32 --heads 32 --dim 4096 --context 1024 --batch 1 \
  --seq-len 1024 --clip none --mode layup --steps 3 --warmup 0 --eval-every 0 --sample-tokens 0 \
  --checkpoint-every 0 --out "$work/run-6.65b"

# 2. Small runs: measured peak against the plan's host memory.
for mode in gpu layup; do
  timed "small-$mode" 240 train --model gpt2 --batch 8 --seq-len 256 --steps 4 --warmup 0 \
    --eval-every 0 --sample-tokens 0 --mode "$mode" --out "$work/run-small-$mode"
done

# 3. SIGTERM during a layup run on CUDA, then --resume alone.
run=$work/run-term
"$layup" train --model gpt2 --batch 8 --seq-len 256 --steps 100000 --warmup 0 --eval-every 0 \
  --checkpoint-every 0 --log-every 1 --mode layup --out "$run" > "$out/sigterm.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q '"loss"' "$run/log.jsonl" 2>/dev/null && break
  sleep 0.2
done
kill -TERM "$pid"
wait "$pid"
note "sigterm: exit $?; $(grep -c stopped_by "$run/log.jsonl" 2>/dev/null) stop record(s); $(ls -d "$run"/step-* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')"
grep -E "stopped by|continue with|checkpoint:" "$out/sigterm.log" | sed 's/^/    /' | tee -a "$summary"
step=$(ls -d "$run"/step-* | tail -n 1 | sed 's/.*step-0*//')
timeout 240 "$layup" train --resume "$run" --until-step $((step + 2)) > "$out/resume.log" 2>&1
note "resume alone: exit $?; $(ls -d "$run"/step-* | xargs -n1 basename | tr '\n' ' ')"

# 4. The README's bench example.
timed bench-gpt2-b32 300 bench --model gpt2 --batch 32 --seq-len 1024 --steps 5
grep -E "tokens/s|ms/step" "$out/bench-gpt2-b32.log" | head -n 3 | sed 's/^/    /' | tee -a "$summary"

# 5. A plan over the GPU's free memory (cudaMemGetInfo, less a reserve): refused before allocating.
timed gpu-over-free 120 bench --model gpt2-xl --batch 64 --seq-len 1024 --steps 1
