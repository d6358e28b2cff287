// `layup sample`'s memory: the parts come from the lists the backends allocate
// (cpu_backend_buffers, describe_cuda_backend_buffers) and kv_cache_bytes, so the plan is what
// is allocated.
#include "sample/sample_memory.h"

#include "backend/cpu/cpu_backend_buffers.h"
#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/model_backend.h"
#include "core/error.h"
#include "memory/memory_accountant.h"
#include "model/parameter_layout.h"

namespace layup {

namespace {

size_t sum_bytes(const BufferList& list) {
  size_t bytes = 0;
  for (const PlannedAllocation& buffer : list) bytes += buffer.bytes;
  return bytes;
}

}  // namespace

size_t SampleMemoryPlan::host_bytes() const {
  return request.device == DeviceKind::kCuda ? loaded_weights
                                             : loaded_weights + kv_cache + workspace;
}

size_t SampleMemoryPlan::device_bytes() const {
  return request.device == DeviceKind::kCuda ? device_weights + kv_cache + workspace : 0;
}

std::string SampleMemoryPlan::describe() const {
  const std::string cache = request.kv_cache
                                ? " + key/value cache " + format_bytes(kv_cache) + " (" +
                                      std::to_string(request.positions) + " positions)"
                                : "";
  if (request.device == DeviceKind::kCpu)
    return "weights " + format_bytes(loaded_weights) + " (fp32)" + cache + " + workspace " +
           format_bytes(workspace) + " = " + format_bytes(host_bytes()) + " of host memory";
  return "GPU: weights " + format_bytes(device_weights) + (request.bf16 ? " (bf16)" : " (fp32)") +
         cache + " + workspace " + format_bytes(workspace) + " = " + format_bytes(device_bytes()) +
         "; host: the weights as read, " + format_bytes(loaded_weights) + " (fp32)";
}

SampleMemoryPlan plan_sample_memory(const SampleMemoryRequest& request) {
  LAYUP_CHECK(request.device == DeviceKind::kCpu || request.device == DeviceKind::kCuda,
              "a sample's memory plan needs a resolved device, cpu or cuda");
  SampleMemoryPlan plan;
  plan.request = request;
  const ModelConfig& config = request.config;
  const size_t params = ParameterLayout(config).total_count();
  plan.loaded_weights = params * sizeof(float);
  if (request.device == DeviceKind::kCpu) {
    plan.kv_cache = request.kv_cache ? kv_cache_bytes(config, request.positions, sizeof(float)) : 0;
    plan.workspace = sum_bytes(cpu_backend_buffers(config, 1, request.piece_tokens));
    return plan;
  }
  const ComputeDtype dtype = request.bf16 ? ComputeDtype::kBFloat16 : ComputeDtype::kFloat32;
  const CudaBackendBuffers buffers =
      describe_cuda_backend_buffers(config, 1, request.piece_tokens, dtype, 0, {});
  // bf16: the kernels read the compute copy (the buffers' first region), which the weights reach
  // through a staging buffer without an fp32 copy on the GPU; fp32: the weights themselves.
  plan.device_weights = request.bf16 ? buffers.regions[0].bytes : plan.loaded_weights;
  plan.kv_cache = request.kv_cache
                      ? kv_cache_bytes(config, request.positions, request.bf16 ? 2 : sizeof(float))
                      : 0;
  plan.workspace = buffers.regions[1].bytes + buffers.regions[2].bytes +
                   buffers.cublaslt_workspace.bytes +
                   (request.bf16 ? kSampleStagingFloats * sizeof(float) : 0);
  return plan;
}

void check_sample_memory(const SampleMemoryPlan& plan, size_t host_usable,
                         const std::string& host_source, size_t device_free) {
  const SampleMemoryRequest& r = plan.request;
  const std::string smaller =
      r.kv_cache ? "fewer positions (a shorter --prompt or fewer --tokens: the cache holds both)"
                 : "fewer positions (a shorter --prompt or fewer --tokens), or the key/value "
                   "cache (drop --no-kv-cache: its workspace is one piece of the prompt)";
  LAYUP_CHECK(plan.host_bytes() <= host_usable, "layup sample needs ",
              format_bytes(plan.host_bytes()), " of host memory (", plan.describe(),
              "); this machine can give ", host_source, ". Try a smaller model, ", smaller,
              r.device == DeviceKind::kCpu ? ", or --device cuda" : "");
  if (r.device != DeviceKind::kCuda) return;
  LAYUP_CHECK(plan.device_bytes() <= device_free, "layup sample needs ",
              format_bytes(plan.device_bytes()), " of GPU memory (", plan.describe(),
              "); the GPU has ", format_bytes(device_free), " free. Try ",
              r.bf16 ? "" : "--dtype bf16 (half the weights' bytes), ", smaller,
              ", or --device cpu");
}

}  // namespace layup
