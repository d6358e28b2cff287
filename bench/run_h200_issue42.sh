#!/usr/bin/env bash
# Issue 42 on the H200 machine: the step as a plan (one executor for offload and layup, one model
# graph for both backends) costs no speed and the predictions hold. Two trees, each a
# `git archive` tarball in .carry (carried): .carry/before.tar and .carry/after.tar, made by
#   git archive --prefix=before/ 42f48df src CMakeLists.txt scripts bench > .carry/before.tar
#   git archive --prefix=after/ HEAD src CMakeLists.txt scripts bench > .carry/after.tar
# Phases (one device call each; PHASES="build bench" runs several in one call):
#   build  both trees built for sm_90 (layup; the after tree's CUDA tests too), the CUDA tests run
#   bench  `layup bench` in gpu and layup mode at gpt2 B=32 and gpt2-xl B=4 (T=1024, bf16, clip
#          1.0), before and after alternately in rounds while the call has time; the after
#          binary calibrated at each shape first, so its runs carry the step-time model's
#          prediction; bench_table.md: best tokens/s per side, after / before, measured / predicted
#   big    the 13B-class GPT (L40 H40 C5120, T=1024, B=32 x 4, --recompute 3, clip 1.0 deferred)
#          in layup mode: the after tree calibrated at its shape and `layup memory` (the planner's
#          split and predicted step), then `layup bench` (1 warm-up, STEPS timed steps) for each
#          side in SIDES (before and after by default)
#   kernels gpt2-xl B=4 in gpu mode, one step under Nsight Compute on each side
#          (bench/kernel_breakdown.py: every kernel's time alone): kernels-<side>.md, so a gap
#          between the sides' steps is placed in the kernels or between them
#   trace  gpt2-xl B=4 in gpu mode with --trace on each side (trace-<side>.json): the host's
#          timeline of a step, where the hand-offs between threads show
# A machine that came back bare between calls builds what is missing first. Binaries built here
# stand in for those builds where .carry/bin holds them (layup-before, layup, layup_cuda_tests:
# BUILD=... scripts/build_device_binary.sh, the tests target added). Logs go to $OUT.
set -uo pipefail
# shellcheck source=bench/wait_for_free_gpu.sh
source "$(dirname "$0")/wait_for_free_gpu.sh"

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/issue42}
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"

build_tree() {  # side, targets...: unpacks .carry/<side>.tar and builds it in /tmp/build-<side>
  local side=$1
  shift
  rm -rf "$repo/.carry/$side" && tar -xf "$repo/.carry/$side.tar" -C "$repo/.carry" &&
    cmake -S "$repo/.carry/$side" -B "/tmp/build-$side" "${cmake_args[@]}" \
      > "$out/configure-$side.log" 2>&1 &&
    cmake --build "/tmp/build-$side" -j8 --target "$@" > "$out/build-$side.log" 2>&1
  echo "$side build: exit $? at ${SECONDS}s"
}
for carried in before:layup-before after:layup after:layup_cuda_tests; do
  side=${carried%%:*} file=${carried#*:}
  if [ -x "$repo/.carry/bin/$file" ]; then
    mkdir -p "/tmp/build-$side" && ln -sf "$repo/.carry/bin/$file" "/tmp/build-$side/${file%-before}"
  fi
done
ensure_built() {  # builds whichever tree lacks its binary, both at once
  local pids=()
  [ -x /tmp/build-before/layup ] || { build_tree before layup & pids+=($!); }
  if [ ! -x /tmp/build-after/layup ]; then
    if [ "${1:-}" = tests ]; then build_tree after layup layup_cuda_tests & else build_tree after layup & fi
    pids+=($!)
  elif [ "${1:-}" = tests ] && [ ! -x /tmp/build-after/layup_cuda_tests ]; then
    build_tree after layup_cuda_tests & pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "$pid"; done
}

for phase in ${PHASES:-build}; do
  echo "=== $phase at ${SECONDS}s"
  wait_for_free_gpu
  case $phase in
    build)
      nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
      ensure_built tests
      /tmp/build-after/layup_cuda_tests --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
      echo "cuda tests: exit $? at ${SECONDS}s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
      grep -E "FAILED|Failure" "$out/cuda_tests.log" | head -n 30
      /tmp/build-after/layup --version
      /tmp/build-before/layup --version
      ;;
    bench)
      ensure_built
      after=/tmp/build-after/layup before=/tmp/build-before/layup
      configs=("gpt2 32 gpu" "gpt2 32 layup" "gpt2-xl 4 gpu" "gpt2-xl 4 layup")
      for model_batch in "gpt2 32" "gpt2-xl 4"; do
        set -- $model_batch
        "$after" calibrate --model "$1" --batch "$2" --seq-len 1024 > "$out/calibrate-$1.txt" 2>&1 ||
          echo "calibrate $1: exit $?"
      done
      echo "calibrated at ${SECONDS}s"
      for round in 1 2 3; do
        [ "$round" -gt 1 ] && [ "$SECONDS" -gt "${ROUND_UNTIL:-380}" ] && break
        for config in "${configs[@]}"; do
          set -- $config
          name=$1-b$2-$3
          for side in before after; do
            # The before binary reads no calibration: the after one's has rates it does not know.
            binary=("$after")
            [ $side = before ] && binary=(env HOME=/tmp/home-before "$before")
            timeout 200 "${binary[@]}" bench --model "$1" --batch "$2" --seq-len 1024 --mode "$3" \
              --clip 1.0 --json "$out/$name-$side-$round.json" > "$out/$name-$side-$round.log" 2>&1 ||
              echo "$name $side $round: exit $?"
          done
        done
        echo "round $round done at ${SECONDS}s"
      done
      python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
rows = ["| config | mode | before tok/s | after tok/s | after / before | after: measured / predicted |",
        "|---|---|---|---|---|---|"]
for model, batch, mode in [("gpt2", 32, "gpu"), ("gpt2", 32, "layup"), ("gpt2-xl", 4, "gpu"),
                           ("gpt2-xl", 4, "layup")]:
    name = f"{model}-b{batch}-{mode}"
    runs = {side: [json.load(open(f)) for f in glob.glob(os.path.join(out, f"{name}-{side}-*.json"))]
            for side in ("before", "after")}
    if not runs["before"] or not runs["after"]:
        rows.append(f"| {model} B={batch} | {mode} | missing | | | |")
        continue
    best = {side: max(runs[side], key=lambda r: r["tokens_per_s"]) for side in runs}
    predicted = (best["after"].get("predicted") or {}).get("measured_over_predicted")
    ratio = f"{predicted:.2f}" if predicted else "n/a"
    rows.append(f"| {model} B={batch} | {mode} | {best['before']['tokens_per_s']:,.0f} | "
                f"{best['after']['tokens_per_s']:,.0f} | "
                f"{best['after']['tokens_per_s'] / best['before']['tokens_per_s']:.3f} | {ratio} |")
table = "\n".join(rows)
open(os.path.join(out, "bench_table.md"), "w").write(table + "\n")
print(table)
EOF
      ;;
    big)
      ensure_built
      layup=/tmp/build-after/layup
      shape=(--layers 40 --heads 40 --dim 5120 --context 1024 --seq-len 1024 --batch 32
        --grad-accum 4 --mode layup --recompute 3 --clip 1.0 --layup-clip deferred)
      "$layup" calibrate --layers 40 --heads 40 --dim 5120 --context 1024 --batch 32 \
        --recompute 3 > "$out/calibrate-13b.txt" 2>&1 || echo "calibrate 13b: exit $?"
      "$layup" memory "${shape[@]}" --device cuda --no-checkpoints --explain \
        > "$out/memory-13b.txt" 2>&1
      grep -E "note: layup keeps|host memory at the peak|predicted step  " "$out/memory-13b.txt"
      for side in ${SIDES:-before after}; do
        binary=("$layup")
        [ $side = before ] && binary=(env HOME=/tmp/home-before /tmp/build-before/layup)
        /usr/bin/time -v "${binary[@]}" bench "${shape[@]}" --steps "${STEPS:-3}" --warmup 1 \
          --json "$out/13b-$side.json" > "$out/bench-13b-$side.log" 2> "$out/time-13b-$side.txt"
        echo "13b bench $side: exit $? at ${SECONDS}s"
        tail -n 25 "$out/bench-13b-$side.log"
        grep -E "Maximum resident" "$out/time-13b-$side.txt"
      done
      ;;
    trace)
      ensure_built
      for side in before after; do
        env HOME="/tmp/home-$side" "/tmp/build-$side/layup" bench --model gpt2-xl --batch 4 \
          --seq-len 1024 --mode gpu --clip 1.0 --trace "$out/trace-$side.json" \
          > "$out/trace-$side.log" 2>&1
        echo "trace $side: exit $? at ${SECONDS}s; $(grep -E 'tokens/s' "$out/trace-$side.log" | tail -n 1)"
      done
      ;;
    kernels)
      ensure_built
      for side in before after; do
        env HOME="/tmp/home-$side" python3 "$repo/bench/kernel_breakdown.py" \
          --layup "/tmp/build-$side/layup" -- --model gpt2-xl --batch 4 --seq-len 1024 \
          --mode gpu --clip 1.0 > "$out/kernels-$side.md" 2> "$out/kernels-$side.log"
        echo "kernels $side: exit $? at ${SECONDS}s; $(tail -n 1 "$out/kernels-$side.md")"
        head -n 8 "$out/kernels-$side.md"
      done
      ;;
  esac
done
echo "done at ${SECONDS}s"
