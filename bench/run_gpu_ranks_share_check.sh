#!/usr/bin/env bash
# ZeRO-1 of offload and layup on a GPU where the machine has one: two ranks share it
# (LAYUP_RANKS_SHARE_GPUS=1) and each run is compared with one process taking both micro-batches
# (docs/parallel.md): losses and the last checkpoint's files bit for bit, resume 2 -> 1 and 1 -> 2,
# and each rank's host moments as its accountant measured them. Runs that sum over NCCL cannot
# share a GPU; one is started to show the refusal.
#   LAYUP_BIN  a layup built with CUDA and MPI (default .carry/bin/layup-mpi, built against the
#              Open MPI wheel in .carry: scripts/build_device_binary.sh with MPI_WHEEL=1)
#   OUT        where the logs go (default /tmp/ranks-share)
#   DEVICE     cuda (default), or cpu to try the script on a machine without a GPU
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
layup=${LAYUP_BIN:-$repo/.carry/bin/layup-mpi}
out=${OUT:-/tmp/ranks-share}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 LAYUP_RANKS_SHARE_GPUS=1
export LAYUP_DATA_DIR=${LAYUP_DATA_DIR:-$repo/data}
# shellcheck source=scripts/open_mpi_wheel.sh
source "$repo/scripts/open_mpi_wheel.sh"
command -v mpirun > /dev/null || use_open_mpi_wheel "$repo" || exit 1
"$layup" --version
two=(mpirun --oversubscribe --bind-to none -np 2 -x LAYUP_RANKS_SHARE_GPUS -x LAYUP_DATA_DIR -x LD_LIBRARY_PATH
  -x PATH "$layup")
"$layup" tokenize --out "$work/shards" "$repo/data/corpus/austen.txt" \
  "$repo/data/corpus/kjv.txt" > "$out/tokenize.log" 2>&1 || { echo "tokenize failed"; exit 1; }
device=(--device "${DEVICE:-cuda}")
[ "${DEVICE:-cuda}" = cpu ] && device+=(--threads 1)
common=(--model small --seq-len 256 --batch 4 --grad-accum 2 "${device[@]}" --eval-every 0
  --sample-tokens 0 --log-every 1 --warmup 2 --lr 1e-3 --data "$work/shards")

same() {  # name, folder a, folder b, step: the logged losses and norms, and the step's files
  local verdict
  verdict=$(python3 - "$2/log.jsonl" "$3/log.jsonl" << 'EOF'
import json, sys
def logged(path):
    rows = [json.loads(line) for line in open(path)]
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows if "loss" in r]
a, b = logged(sys.argv[1]), logged(sys.argv[2])
print(f"{len(b)} steps logged, " + ("losses and norms equal" if a and a == b else
      f"losses or norms DIFFER: {a[-1:]} vs {b[-1:]}"))
EOF
  )
  for file in model.safetensors training_state.safetensors; do
    if cmp -s "$2/$4/$file" "$3/$4/$file"; then verdict="$verdict, $file equal"
    else verdict="$verdict, $file DIFFERS"; fi
  done
  echo "$1: $verdict"
}

declare -A modes=(
  [offload]="--mode offload --clip 1.0"
  [layup-host]="--mode layup --layup-head host --optimizer-placement host --clip 1.0"
  [layup-streamed]="--mode layup --layup-head host --optimizer-placement host --clip 1.0 --streamed-blocks 2"
  [layup-no-clip]="--mode layup --layup-head host --optimizer-placement host --clip none"
)
for mode in offload layup-host layup-streamed layup-no-clip; do
  read -r -a flags <<< "${modes[$mode]}"
  args=(train "${common[@]}" "${flags[@]}" --steps 6)
  timeout 120 "$layup" "${args[@]}" --out "$work/$mode-one" > "$out/$mode-one.log" 2>&1 ||
    echo "$mode, one rank: exit $?"
  timeout 180 "${two[@]}" "${args[@]}" --out "$work/$mode-two" > "$out/$mode-two.log" 2>&1 ||
    echo "$mode, two ranks: exit $?"
  grep -m1 "ZeRO-1" "$out/$mode-two.log"
  same "$mode, 2 ranks vs 1" "$work/$mode-one" "$work/$mode-two" step-00000006
done

# The check can fail: clipping at 1.0 against none gives other losses and weights.
same "control, layup clipped vs not (must differ)" "$work/layup-host-one" "$work/layup-no-clip-one" \
  step-00000006

# Resume with another rank count (layup, host updates, clipping).
read -r -a flags <<< "${modes[layup-host]}"
args=(train "${common[@]}" "${flags[@]}" --steps 6)
for order in "2 1" "1 2"; do
  read -r first next <<< "$order"
  folder=$work/split-$first-$next
  for count in $first $next; do
    if [ "$count" = "$first" ]; then command=("${args[@]}" --until-step 3 --out "$folder")
    else  # the placement is not a setting a checkpoint keeps: given again
      command=(train --resume "$folder" --data "$work/shards" --layup-head host
        --optimizer-placement host "${device[@]:2}")
    fi
    if [ "$count" = 2 ]; then timeout 180 "${two[@]}" "${command[@]}"
    else timeout 120 "$layup" "${command[@]}"; fi >> "$out/resume-$first-$next.log" 2>&1 ||
      echo "resume $first -> $next, $count ranks: exit $?"
  done
  same "layup-host, resumed $first -> $next vs straight" "$work/layup-host-one" "$folder" \
    step-00000006
done

# Each rank's host moments as its accountant measured them (bench's JSON, rank 0's).
bench=(bench --model small --seq-len 256 --batch 4 --grad-accum 2 "${device[@]}" --mode layup
  --layup-head host --optimizer-placement host --clip 1.0 --layup-clip deferred --warmup 1 --steps 2)
timeout 120 "$layup" "${bench[@]}" --json "$out/bench-one.json" > "$out/bench-one.log" 2>&1
timeout 180 "${two[@]}" "${bench[@]}" --json "$out/bench-two.json" > "$out/bench-two.log" 2>&1
python3 - "$out/bench-one.json" "$out/bench-two.json" << 'EOF'
import json, sys
def host(path):
    cells = json.load(open(path))["memory"]["measured"]["cells"]
    return {c["class"]: c["peak_bytes"] for c in cells
            if c["side"] == "host" and c["class"] in ("master", "moments")}
one, two = host(sys.argv[1]), host(sys.argv[2])
print(f"host moments measured: one rank {one['moments'] / 2**20:.1f} MiB, rank 0 of two "
      f"{two['moments'] / 2**20:.1f} MiB ({two['moments'] / one['moments']:.3f}); master weights "
      f"{one['master'] / 2**20:.1f} vs {two['master'] / 2**20:.1f} MiB")
EOF
grep -h "tokens/s" "$out/bench-one.log" "$out/bench-two.log"

# A run that sums over NCCL on the shared GPU: refused, saying why.
timeout 120 "${two[@]}" train "${common[@]}" --mode gpu --steps 2 --out "$work/gpu-two" \
  > "$out/gpu-two.log" 2>&1
echo "gpu mode, two ranks on one GPU: exit $?; $(grep -m1 -o 'NCCL refuses[^;]*' "$out/gpu-two.log")"
