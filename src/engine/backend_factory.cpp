// Backend selection: the CPU backend always, the CUDA backend where built and a GPU is usable.
#include "engine/backend_factory.h"

#include "core/error.h"

#ifdef LAYUP_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#endif

namespace layup {

namespace {

// Whether the CUDA backend can run here; `why` says why not.
bool cuda_usable(std::string* why) {
#ifdef LAYUP_HAVE_CUDA
  return cuda_device_available(why);
#else
  *why =
      "this build of layup has no CUDA backend (it was configured with LAYUP_CUDA=OFF, or CMake "
      "found no nvcc)";
  return false;
#endif
}

// Refuses the options only the CUDA backend has on a target that runs on the CPU; `why` says why
// the CPU was chosen where --device auto chose it. --attention auto stays fine: it only picks
// among CUDA kernels where there are some.
void check_cpu_backend_options(const ComputeTarget& target, const std::string& why) {
  const std::string cpu_because =
      why.empty() ? std::string() : " (--device auto chose the CPU: " + why + ")";
  LAYUP_CHECK(target.recompute == 0, "--recompute ", target.recompute,
              " is a CUDA backend option: the CPU backend keeps every activation (its memory is "
              "the host's)",
              cpu_because, "; drop --recompute or use --device cuda");
  LAYUP_CHECK(target.algorithms == AlgorithmChoice::kHeuristic,
              "--algorithms timed is a CUDA backend option (it times cuBLASLt's and cuDNN's "
              "algorithms)",
              cpu_because, "; drop it or use --device cuda");
  LAYUP_CHECK(target.attention == AttentionChoice::kAuto, "--attention ", name_of(target.attention),
              " (or LAYUP_ATTENTION=", name_of(target.attention),
              ") is a CUDA backend option: it picks the CUDA backend's bf16 attention kernel, and "
              "the CPU backend has one of its own",
              cpu_because, "; drop it (and unset LAYUP_ATTENTION) or use --device cuda");
}

}  // namespace

void use_gpu_of_local_rank(int local_rank) {
#ifdef LAYUP_HAVE_CUDA
  use_cuda_device_of_local_rank(local_rank);
#else
  (void)local_rank;
#endif
}

ComputeTarget resolve_compute_target(const ComputeTarget& requested) {
  ComputeTarget target = requested;
  std::string why;
  if (target.device == DeviceKind::kAuto)
    target.device = cuda_usable(&why) ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (target.device == DeviceKind::kCuda)
    LAYUP_CHECK(cuda_usable(&why), "--device cuda: ", why, "; use --device cpu");
  if (target.dtype == Dtype::kAuto)
    target.dtype = target.device == DeviceKind::kCuda ? Dtype::kBf16 : Dtype::kFp32;
  LAYUP_CHECK(target.device == DeviceKind::kCuda || target.dtype == Dtype::kFp32,
              "the CPU backend computes in fp32 only; use --dtype fp32 (or --device cuda)");
  // Here, before the run is planned, not when the backend is built after it.
  if (target.device == DeviceKind::kCpu) check_cpu_backend_options(target, why);
  return target;
}

DeviceKinds device_kinds_of(DeviceKind device) {
  LAYUP_CHECK(device != DeviceKind::kAuto, "the kinds of memory of an unresolved device");
  if (device == DeviceKind::kCuda) return {MemoryKind::kDevice, MemoryKind::kPinnedMapped};
  return {MemoryKind::kHost, MemoryKind::kHost};
}

DeviceMemoryAttributes memory_attributes_of(DeviceKind device) {
  LAYUP_CHECK(device != DeviceKind::kAuto, "memory attributes need a resolved device, cpu or cuda");
  if (device == DeviceKind::kCpu) return cpu_memory_attributes();
#ifdef LAYUP_HAVE_CUDA
  return read_cuda_memory_attributes();
#else
  return assumed_cuda_memory_attributes();
#endif
}

BackendAndDevice make_backend(const ComputeTarget& target, const ModelConfig& config, int max_batch,
                              int max_seq_len, std::shared_ptr<MemoryAccountant> accountant) {
  if (!accountant) accountant = std::make_shared<MemoryAccountant>();
#ifdef LAYUP_HAVE_CUDA
  if (target.device == DeviceKind::kCuda) {
    const ComputeDtype dtype =
        target.dtype == Dtype::kBf16 ? ComputeDtype::kBFloat16 : ComputeDtype::kFloat32;
    std::unique_ptr<Device> device = make_cuda_device(accountant);
    return {make_cuda_backend(
                config, max_batch, max_seq_len, dtype, target.recompute, accountant,
                {target.activations_kind, target.scratch_kind, target.compute_copy_elsewhere},
                target.algorithms, target.attention),
            std::move(device), accountant};
  }
#endif
  LAYUP_CHECK(target.device == DeviceKind::kCpu, "no backend for --device ", name_of(target.device),
              ": resolve the target first");
  check_cpu_backend_options(target, "");
  return {make_cpu_backend(config, max_batch, max_seq_len, accountant), make_cpu_device(accountant),
          accountant};
}

}  // namespace layup
