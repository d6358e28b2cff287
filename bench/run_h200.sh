#!/usr/bin/env bash
# The CUDA speed benchmark on one H200, in one call: builds layup with the CUDA backend, then for
# each config runs `layup bench` and the PyTorch peer (eager and torch.compile) on the same
# B x T, and prints a markdown table of tokens/s with the ratios layup / peer.
#
#   bench/run_h200.sh                          # gpt2:32 gpt2-medium:16 gpt2-large:8 gpt2-xl:4
#   CONFIGS="gpt2:32 gpt2-medium:16" bench/run_h200.sh
#   SUITE=modes bench/run_h200.sh              # the three modes and the CPU-AdamW peers
#
# SUITE=speed (the default) is the gpu-mode speed comparison above. SUITE=modes runs, per config,
# `layup bench` in gpu, offload and layup mode (layup with clipping at 1.0, speculative and
# deferred, and with --clip none)
# and bench/pytorch_offload_peer.py's three peers (gpu, conventional offload, layer-wise hooks),
# and tabulates median ms/step, the floor layup bench prints, and the ratios.
#
# SUITE=modes also takes MODE_RUNS (which of gpu offload layup layup-deferred layup-noclip
# layup-holds layup-zerocopy layup-cpuhead layup-noclip-cpuhead to run; the -cpuhead runs pass
# --layup-head host: the embeddings and the final norm updated on the CPU, as the paper does,
# where the other layup runs update them on the GPU (--layup-head auto on a discrete GPU);
# layup-holds clips at 1e9, which never triggers, so layup's
# speculation always holds: what a step costs once training no longer clips; layup-zerocopy is
# --clip none with --place grads=pinned: the CPU reads each block's gradient in place in mapped
# pinned memory, which the GPU's backward wrote over PCIe, instead of a copy into landing
# buffers), PEERS (0: skip the PyTorch peers) and PEER_RUNS (which of the peers gpu offload
# layerwise to run; default all three).
#
# Environment: CONFIGS (model:batch ...), SEQ_LEN (1024), WARMUP (3), STEPS (10), BUDGET_S (540:
# the whole script's wall-clock budget; every command runs under `timeout` with what is left, at
# most COMMAND_LIMIT_S (180) each),
# PYTHON (python3, the one with PyTorch), BUILD (build-h200 in the repository), OUT (where the
# results go; else the build folder), LAYUP_BIN (a layup binary built already, e.g. on another
# machine with the same CUDA: no build here), LAYUP_ARGS (more `layup bench` flags for every layup
# run, e.g. "--algorithms timed"). Dependencies come from .carry/ as in
# src/backend/cuda/run_gpu_tests.sh. Writes four files: build.log, bench.log (every command's
# output), results.json (a list of every run's JSON object) and summary.md (the table).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$repo/build-h200}
out=${OUT:-$build}
configs=${CONFIGS:-"gpt2:32 gpt2-medium:16 gpt2-large:8 gpt2-xl:4"}
suite=${SUITE:-speed}
seq_len=${SEQ_LEN:-1024}
warmup=${WARMUP:-3}
steps=${STEPS:-10}
budget_s=${BUDGET_S:-540}
command_limit_s=${COMMAND_LIMIT_S:-180}
python=${PYTHON:-python3}
mode_runs=${MODE_RUNS:-"gpu offload layup layup-deferred layup-noclip"}
peers=${PEERS:-1}
peer_runs=${PEER_RUNS:-"gpu offload layerwise"}
layup_bin=${LAYUP_BIN:-$build/layup}
read -r -a layup_args <<< "${LAYUP_ARGS:-}"
mkdir -p "$build" "$out"
export PATH="/usr/local/cuda/bin:$PATH"
runs=$(mktemp -d)  # one JSON per run, combined into results.json at the end
log=$out/bench.log
: > "$log"

# Seconds left for a command: the budget minus what has run, less a margin for the summary.
left() { echo $((budget_s - SECONDS - 10)); }

run_timed() {  # name, command...: under timeout with what is left; output appended to bench.log
  local name=$1
  shift
  local limit
  limit=$(left)
  [ "$limit" -gt "$command_limit_s" ] && limit=$command_limit_s
  if [ "$limit" -lt 20 ]; then
    echo "=== $name: skipped, the budget is spent" | tee -a "$log"
    return 1
  fi
  echo "=== $name (timeout ${limit} s): $*" | tee -a "$log"
  local started=$SECONDS
  timeout "$limit" "$@" >> "$log" 2>&1
  local result=$?
  echo "=== $name: exit $result after $((SECONDS - started)) s" | tee -a "$log"
  return $result
}

# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1 |
  tee -a "$log"
if [ -n "${LAYUP_BIN:-}" ]; then
  echo "=== no build: LAYUP_BIN=$layup_bin"
else
  echo "=== build (log: $out/build.log)"
  {
    timeout "$(left)" cmake -S "$repo" -B "$build" "${cmake_args[@]}" &&
      timeout "$(left)" cmake --build "$build" -j"$(nproc)" --target layup
  } > "$out/build.log" 2>&1
  if [ $? -ne 0 ]; then
    tail -n 40 "$out/build.log"
    echo "build failed after $SECONDS s"
    exit 1
  fi
  echo "=== build: done after $SECONDS s"
fi

for config in $configs; do
  model=${config%%:*}
  batch=${config##*:}
  common=(--model "$model" --batch "$batch" --seq-len "$seq_len" --warmup "$warmup"
          --steps "$steps")
  if [ "$suite" = modes ]; then
    for run in $mode_runs; do
      mode=${run%%-*}
      clip=()
      [ "$run" = layup-noclip ] && clip=(--clip none)
      [ "$run" = layup-cpuhead ] && clip=(--layup-head host)
      [ "$run" = layup-noclip-cpuhead ] && clip=(--clip none --layup-head host)
      [ "$run" = layup-deferred ] && clip=(--layup-clip deferred)
      [ "$run" = layup-holds ] && clip=(--clip 1e9)
      [ "$run" = layup-zerocopy ] && clip=(--clip none --place grads=pinned)
      run_timed "layup $run $model B=$batch" "$layup_bin" bench "${common[@]}" --device cuda \
        --dtype bf16 --mode "$mode" "${clip[@]}" "${layup_args[@]}" \
        --json "$runs/$model-layup-$run.json"
    done
    [ "$peers" = 1 ] || continue
    for peer in $peer_runs; do
      run_timed "pytorch $peer $model B=$batch" "$python" "$repo/bench/pytorch_offload_peer.py" \
        "${common[@]}" --device cuda --mode "$peer" --json "$runs/$model-pytorch-$peer.json"
    done
    continue
  fi
  run_timed "layup $model B=$batch" "$layup_bin" bench "${common[@]}" --device cuda \
    --dtype bf16 "${layup_args[@]}" --json "$runs/$model-layup.json"
  run_timed "pytorch eager $model B=$batch" "$python" "$repo/bench/pytorch_peer.py" \
    "${common[@]}" --device cuda --json "$runs/$model-eager.json"
  run_timed "pytorch compile $model B=$batch" "$python" "$repo/bench/pytorch_peer.py" \
    "${common[@]}" --device cuda --compile --json "$runs/$model-compile.json"
done

"$python" - "$runs" "$out" "$configs" "$suite" <<'PY'
import glob, json, os, sys

runs_dir, out_dir, configs, suite = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4]
results = []
for path in sorted(glob.glob(os.path.join(runs_dir, "*.json"))):
    with open(path) as f:
        results.append(json.load(f))
with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)

if suite == "modes":
    def run(model, name):
        path = os.path.join(runs_dir, f"{model}-{name}.json")
        return json.load(open(path)) if os.path.exists(path) else None
    def ms(r):
        return f"{r['median_ms']:.1f}" if r else "-"
    def ms_floor(r):  # a layup run against the floor it measured itself (rates vary run to run)
        floor = (r or {}).get("floor") or {}
        if not floor:
            return ms(r)
        return f"{r['median_ms']:.1f} ({r['median_ms'] / floor['total_ms']:.2f}x of {floor['total_ms']:.1f})"
    lines = [
        "| config | B | layup gpu | layup offload | layup layup (clip 1.0, speculative) "
        "| steps clipped | layup layup (clip 1.0, deferred) | layup layup (no clip) "
        "| layup layup (clip never triggered) | layup layup (no clip, grads pinned: zero-copy) "
        "| layup layup (clip 1.0, head on CPU) | layup layup (no clip, head on CPU) "
        "| torch gpu | torch offload | torch layer-wise "
        "| offload vs torch offload | layup (no clip) vs torch layer-wise |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in configs:
        model, batch = config.split(":")
        g, o, l, d, n, h, z, lc, nc = (run(model, f"layup-{x}") for x in (
            "gpu", "offload", "layup", "layup-deferred", "layup-noclip", "layup-holds",
            "layup-zerocopy", "layup-cpuhead", "layup-noclip-cpuhead"))
        clipped = f"{l['clipped_steps']}/{l['steps']}" if l and "clipped_steps" in l else "-"
        tg, to, tl = (run(model, f"pytorch-{x}") for x in ("gpu", "offload", "layerwise"))
        vs = lambda a, b: f"{b['median_ms'] / a['median_ms']:.2f}x" if a and b else "-"
        lines.append(f"| {model} | {batch} | {ms(g)} | {ms(o)} | {ms_floor(l)} | {clipped} "
                     f"| {ms_floor(d)} | {ms_floor(n)} | {ms_floor(h)} | {ms_floor(z)} "
                     f"| {ms_floor(lc)} | {ms_floor(nc)} "
                     f"| {ms(tg)} | {ms(to)} | {ms(tl)} | {vs(o, to)} | {vs(n, tl)} |")
    commit = next((r["git_commit"] for r in results if "git_commit" in r), "unknown")
    lines += ["", f"median ms/step at T={results[0]['seq_len'] if results else '?'}, commit {commit}; "
              "each layup run's (Nx of F) = its median over the floor it measured itself: device "
              "forward + max(device backward, CPU AdamW of the blocks) + CPU AdamW of embeddings and "
              "final norm, from that run's rates (the same floor where a run updates the head on "
              "the GPU); 'vs' = peer ms / layup ms. The layup runs update the embeddings and the final "
              "norm where --layup-head auto puts them (the GPU, on a discrete one) except in the "
              "'head on CPU' columns (--layup-head host); each run's layup_head is in results.json."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    sys.exit(0)

def find(model, engine):
    for r in results:
        if r["model"] == model and r["engine"] == engine:
            return r
    return None

def tps(r):
    return f"{r['tokens_per_s']:,.0f}" if r else "-"

def ratio(a, b):
    return f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}" if a and b else "-"

def whole_gpu_bytes(r):
    """Whole-GPU memory in use after a step, max: both engines read cudaMemGetInfo the same way."""
    key = "memory_peak_bytes" if r["engine"] == "layup" else "memory_device_used_peak_bytes"
    return r.get(key)

def allocator_bytes(r):
    """The peak of what the engine's own allocator held on the device: layup's accountant,
    PyTorch's caching allocator (torch.cuda.max_memory_allocated)."""
    if r["engine"] == "layup":
        return r["memory"]["measured"]["device_side"]["peak_bytes"]
    return r["memory_peak_bytes"]

def gib_pair(a, b, measure):
    """'a / b = ratio' in GiB for one measure, '-' where a run or its reading is missing."""
    x, y = (measure(r) if r else None for r in (a, b))
    if not x or not y:
        return "-"
    return f"{x / 2**30:.1f} / {y / 2**30:.1f} = {x / y:.2f}"

def mfu(r):
    return f"{100 * r['mfu']:.1f}%" if r and r.get("mfu") is not None else "-"

lines = [
    "| config | B x T | layup tok/s | eager tok/s | compile tok/s | layup/eager | layup/compile "
    "| layup ms/step | layup MFU | compile MFU | GiB layup / compile, whole GPU* "
    "| GiB layup / compile, allocators** |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]
for config in configs:
    model, batch = config.split(":")
    lay, eager, comp = (find(model, e) for e in ("layup", "pytorch-eager", "pytorch-compile"))
    any_run = lay or eager or comp
    bt = f"{batch} x {any_run['seq_len']}" if any_run else batch
    lay_ms = f"{lay['median_ms']:.1f}" if lay else "-"
    lines.append(
        f"| {model} | {bt} | {tps(lay)} | {tps(eager)} | {tps(comp)} | {ratio(lay, eager)} "
        f"| {ratio(lay, comp)} | {lay_ms} | {mfu(lay)} | {mfu(comp)} "
        f"| {gib_pair(lay, comp, whole_gpu_bytes)} | {gib_pair(lay, comp, allocator_bytes)} |")
gpu = next((r["device_name"] for r in results if r.get("device") == "cuda"), "unknown GPU")
commit = next((r["git_commit"] for r in results), "unknown")
lines += [
    "",
    f"{gpu}, commit {commit}; tokens/s over the timed steps, median ms/step; MFU against "
    "989.4 TFLOP/s dense bf16 with 6N + 12LTC FLOPs per token (N = 12LC^2 + VC).",
    "* both: GPU memory in use (cudaMemGetInfo total - free: CUDA context, library workspaces, "
    "allocator reserve, any other process), max after each step. ** layup: its memory "
    "accountant's device-side peak; PyTorch: torch.cuda.max_memory_allocated.",
]
text = "\n".join(lines) + "\n"
with open(os.path.join(out_dir, "summary.md"), "w") as f:
    f.write(text)
print(text)
PY
rm -rf "$runs"
echo "total: $SECONDS s; files in $out: build.log bench.log results.json summary.md"
