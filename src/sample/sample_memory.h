// What `layup sample` holds, summed from the model's shape before anything is allocated (the
// weights are read after the check), and the check against the machine's memory: a model that
// does not fit is refused with what each part needs, not ended by the allocator or the kernel.
#pragma once

#include <cstddef>
#include <string>

#include "core/run_choices.h"
#include "model/model_config.h"

namespace layup {

// Floats of the GPU staging buffer bf16 weights travel through into the compute copy.
inline constexpr size_t kSampleStagingFloats = size_t{1} << 22;

struct SampleMemoryRequest {
  ModelConfig config;
  DeviceKind device = DeviceKind::kCpu;  // resolved: cpu or cuda
  bool bf16 = false;                     // cuda only: the backend computes in bf16
  int positions = 0;     // the longest sequence: prompt and new tokens, within the context
  int piece_tokens = 0;  // the backend's max_seq_len: a prompt piece (cache), else `positions`
  bool kv_cache = true;
};

struct SampleMemoryPlan {
  SampleMemoryRequest request;
  size_t loaded_weights = 0;  // the fp32 weights as read from the checkpoint, host memory
  size_t device_weights = 0;  // cuda: what the kernels read (the fp32 copy, or the bf16 one)
  size_t kv_cache = 0;        // 0 without a cache
  size_t workspace = 0;       // the backend's activations and scratch for one piece, staging
  size_t host_bytes() const;
  size_t device_bytes() const;  // 0 on the CPU backend (its memory is the host's)
  // "weights 474.7 MiB (fp32) + key/value cache 9.0 MiB (128 positions) + workspace 70.1 MiB =
  // 553.8 MiB of host memory" (and a line for the GPU's on cuda).
  std::string describe() const;
};

SampleMemoryPlan plan_sample_memory(const SampleMemoryRequest& request);

// Throws layup::Error where the plan exceeds what the host (host_usable, described by
// host_source) or the GPU (device_free; cuda only) can give: each part's bytes, the budget, and
// what would make it fit.
void check_sample_memory(const SampleMemoryPlan& plan, size_t host_usable,
                         const std::string& host_source, size_t device_free);

}  // namespace layup
