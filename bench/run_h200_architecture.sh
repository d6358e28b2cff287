#!/usr/bin/env bash
# Issue 19 on the H200 machine: the redesigned glue costs no speed, and plan and accountant agree
# there. Two phases, one device call each (the build folders stay on the machine between calls):
#   PHASE=build  builds this tree (build-gpu) and the tree before the change (.carry/before.tar,
#                from `git archive --prefix=before/ COMMIT src CMakeLists.txt scripts bench`) with the
#                CUDA backend for sm_90, and runs this tree's CUDA tests (among them
#                CudaMemory.ThePlanMatchesTheAccountantAfterAStep, every accounted cell, each mode).
#   PHASE=bench  `layup bench` in gpu and layup mode at gpt2 B=32 and gpt2-xl B=4 (T=1024, bf16),
#                before and after alternately, in rounds while the call has time (building both
#                trees first where the machine came back bare); bench_table.md has tokens/s and
#                the ratio after / before of each configuration's best run.
# Logs go to $OUT (the device tool's output folder) or the build folder.
#   PHASE=build bench/run_h200_architecture.sh; PHASE=bench bench/run_h200_architecture.sh
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
after=$repo/build-gpu
before_src=$repo/.carry/before
before=$repo/build-gpu-before
out=${OUT:-$after}
mkdir -p "$out"
export PATH="/usr/local/cuda/bin:$PATH"
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"

if [ "${PHASE:-build}" = before ]; then  # the tree before alone (its build failed, say)
  rm -rf "$before_src" && tar -xf "$repo/.carry/before.tar" -C "$repo/.carry" &&
    cmake -S "$before_src" -B "$before" "${cmake_args[@]}" > "$out/configure-before.log" 2>&1 &&
    cmake --build "$before" -j16 --target layup > "$out/build-before.log" 2>&1
  echo "before build: exit $?"
  "$before/layup" --version
  exit 0
fi
if [ "${PHASE:-build}" = build ]; then
  rm -rf "$before_src" && mkdir -p "$before_src" &&
    tar -xf "$repo/.carry/before.tar" -C "$repo/.carry"
  (cmake -S "$before_src" -B "$before" "${cmake_args[@]}" > "$out/configure-before.log" 2>&1 &&
    cmake --build "$before" -j8 --target layup > "$out/build-before.log" 2>&1
   echo "before build: exit $?" > "$out/before-status.txt") &
  cmake -S "$repo" -B "$after" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
    cmake --build "$after" -j8 --target layup layup_cuda_tests > "$out/build.log" 2>&1
  echo "after build: exit $?"
  wait
  cat "$out/before-status.txt"
  "$after/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
  echo "cuda tests: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
  grep -E "FAILED" "$out/cuda_tests.log" | head -n 20
  "$after/layup" --version
  "$before/layup" --version
  exit 0
fi

# A machine released between the calls comes back bare: build what is missing first.
if [ ! -x "$after/layup" ] || [ ! -x "$before/layup" ]; then
  rm -rf "$before_src" && mkdir -p "$before_src" && tar -xf "$repo/.carry/before.tar" -C "$repo/.carry"
  (cmake -S "$before_src" -B "$before" "${cmake_args[@]}" > "$out/configure-before.log" 2>&1 &&
    cmake --build "$before" -j8 --target layup > "$out/build-before.log" 2>&1) &
  cmake -S "$repo" -B "$after" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
    cmake --build "$after" -j8 --target layup > "$out/build.log" 2>&1
  wait
  echo "rebuilt both trees in ${SECONDS}s"
fi

table=$out/bench_table.md
echo "| config | mode | before tok/s | after tok/s | after / before |" > "$table"
echo "|---|---|---|---|---|" >> "$table"
best() {  # the largest tokens_per_s of the JSON files given
  python3 -c 'import json,sys; print(round(max(json.load(open(f))["tokens_per_s"] for f in sys.argv[1:])))' "$@"
}
configs=("gpt2 32 gpu" "gpt2 32 layup" "gpt2-xl 4 gpu" "gpt2-xl 4 layup")
# Rounds over every configuration, before and after alternately, while the call has time left
# (a device call ends at 600 s): at least one round, a second and third when they fit.
for round in 1 2 3; do
  [ "$round" -gt 1 ] && [ "$SECONDS" -gt 330 ] && break
  for config in "${configs[@]}"; do
    set -- $config
    model=$1 batch=$2 mode=$3
    name=$model-b$batch-$mode
    for side in before after; do
      binary=$after/layup
      [ $side = before ] && binary=$before/layup
      timeout 200 "$binary" bench --model "$model" --batch "$batch" --seq-len 1024 --mode "$mode" \
        --json "$out/$name-$side-$round.json" > "$out/$name-$side-$round.log" 2>&1 ||
        echo "$name $side $round: exit $?"
    done
  done
  echo "round $round done at ${SECONDS}s"
done
for config in "${configs[@]}"; do
  set -- $config
  model=$1 batch=$2 mode=$3
  name=$model-b$batch-$mode
  b=$(best "$out/$name"-before-*.json) a=$(best "$out/$name"-after-*.json)
  echo "| $model B=$batch | $mode | $b | $a | $(python3 -c "print(f'{$a / $b:.3f}')") |" >> "$table"
done
cat "$table"
