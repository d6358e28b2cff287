#!/usr/bin/env bash
# Issue 22 on a machine with several GPUs, in one device call: data parallel through mpirun and
# NCCL against one GPU, and PyTorch DDP (torchrun) against PyTorch on one GPU, on the same configs.
#   CONFIGS  model:batch-per-GPU pairs (default "gpt2:32 gpt2-xl:4")
#   MODES    layup modes timed (default "gpu layup")
#   RANKS    ranks (default: every GPU nvidia-smi lists)
#   PHASE    comma-separated, in order (default build,scale): build (layup and the CUDA tests, which
#            it runs), mpi (two ranks of a small CPU bench: the MPI in use works on this machine),
#            scale (the timings)
# Open MPI: the machine's mpirun, else the PyPI wheel scripts/make_device_carry.sh puts in .carry/
# (unpacked to /tmp, relocated through OPAL_PREFIX). NVLink multicast stays off (the machine's
# rule). Logs and JSON in build-gpu/logs, packed into $OUT/logs.tar.gz after each phase.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build-gpu
out=$build/logs
mkdir -p "$out"
pack_logs() { [ -z "${OUT:-}" ] || tar -C "$out" -czf "$OUT/logs.tar.gz" .; }
export PATH="/usr/local/cuda/bin:$PATH"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=scripts/gpu_cmake_args.sh
source "$repo/scripts/gpu_cmake_args.sh"
cmake_args+=(-DLAYUP_MPI=ON)
# shellcheck source=scripts/open_mpi_wheel.sh
source "$repo/scripts/open_mpi_wheel.sh"
if ! command -v mpirun > /dev/null; then
  use_open_mpi_wheel "$repo" || exit 1
  cmake_args+=(-DMPI_HOME="$open_mpi_prefix")
fi
echo "mpirun: $(command -v mpirun) ($(mpirun --version 2>&1 | head -n 1))"
layup=$build/layup
ranks=${RANKS:-$(nvidia-smi -L | wc -l)}
echo "GPUs: $(nvidia-smi -L | wc -l), ranks: $ranks"
# Every variable a rank needs, passed by mpirun.
mpi=(mpirun --bind-to none -np "$ranks" -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST
  -x NVSHMEM_DISABLE_NVLS -x PATH -x LD_LIBRARY_PATH)

cmake -S "$repo" -B "$build" "${cmake_args[@]}" > "$out/configure.log" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" --target layup layup_cuda_tests > "$out/build.log" 2>&1
echo "build: exit $? after ${SECONDS}s"
"$layup" --version

phases=${PHASE:-build,scale}
for phase in ${phases//,/ }; do
case "$phase" in
build)
  timeout 300 "$build/layup_cuda_tests" --gtest_brief=1 > "$out/cuda_tests.log" 2>&1
  echo "cuda tests: exit $?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/cuda_tests.log" | tr '\n' ' ')"
  ;;
mpi)
  timeout 120 mpirun --oversubscribe -np 2 "$layup" bench --device cpu --model small --batch 2 \
    --seq-len 64 --grad-accum 2 --threads 1 --warmup 1 --steps 2 > "$out/mpi-cpu.log" 2>&1
  echo "two CPU ranks: exit $?; $(grep -E 'tokens/s|ranks' "$out/mpi-cpu.log" | tr '\n' ' ')"
  ;;
scale)
  for config in ${CONFIGS:-gpt2:32 gpt2-xl:4}; do
    model=${config%%:*} batch=${config#*:}
    for mode in ${MODES:-gpu layup}; do
      extra=(--mode "$mode" --clip 1.0)
      [ "$mode" = layup ] && extra+=(--layup-clip deferred)
      timeout 300 "$layup" bench --model "$model" --batch "$batch" "${extra[@]}" --warmup 3 \
        --steps 10 --json "$out/$model-$mode-1.json" > "$out/$model-$mode-1.log" 2>&1
      echo "$model B=$batch $mode, 1 GPU: exit $?"
      timeout 300 "${mpi[@]}" "$layup" bench --model "$model" --batch "$batch" \
        --grad-accum "$ranks" "${extra[@]}" --warmup 3 --steps 10 \
        --json "$out/$model-$mode-$ranks.json" > "$out/$model-$mode-$ranks.log" 2>&1
      echo "$model B=$batch $mode, $ranks GPUs: exit $?"
      grep -E "error" "$out/$model-$mode-$ranks.log" | head -n 3
    done
    (cd "$repo/bench" &&
      timeout 300 python3 pytorch_peer.py --model "$model" --batch "$batch" \
        --json "$out/$model-torch-1.json" > "$out/$model-torch-1.log" 2>&1
      echo "$model B=$batch PyTorch, 1 GPU: exit $?"
      timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node "$ranks" \
        pytorch_ddp_peer.py --model "$model" --batch "$batch" \
        --json "$out/$model-torch-$ranks.json" > "$out/$model-torch-$ranks.log" 2>&1
      echo "$model B=$batch PyTorch DDP, $ranks GPUs: exit $?")
  done
  # One table: tokens/s on 1 and N GPUs, the scaling, the peak memory per GPU (rank 0's reading of
  # its GPU for layup; the largest of any rank for DDP), layup against DDP.
  python3 - "$out" "$ranks" <<'PY'
import json, pathlib, sys
out, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
def load(name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
print(f"| config | engine | 1 GPU tok/s | {n} GPUs tok/s | scaling | peak GiB a GPU ({n}) |")
print("|---|---|---|---|---|---|")
for path in sorted(out.glob(f"*-{n}.json")):
    stem = path.stem[: -len(f"-{n}")]
    model, engine = stem.rsplit("-", 1)
    one, many = load(f"{stem}-1"), load(path.stem)
    if not (one and many):
        continue
    peak = many.get("memory_device_used_peak_bytes") or many.get("memory_peak_bytes", 0)
    print(f"| {model} | {engine} | {one['tokens_per_s']:,.0f} | {many['tokens_per_s']:,.0f} | "
          f"{many['tokens_per_s'] / one['tokens_per_s']:.2f}x | {peak / 2**30:.1f} |")
PY
  ;;
esac
pack_logs
done
