// Picks and builds the backend (ops) and device (memory, optimizer math) a run computes on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/algorithm_choice.h"
#include "backend/device.h"
#include "backend/model_backend.h"
#include "memory/device_attributes.h"
#include "memory/memory_accountant.h"

namespace layup {

struct ComputeTarget {
  DeviceKind device = DeviceKind::kAuto;
  Dtype dtype = Dtype::kAuto;
  int recompute = 0;  // --recompute: 0, 1 or 2 (backend/cuda/cuda_backend.h); cuda only
  AlgorithmChoice algorithms = AlgorithmChoice::kHeuristic;  // cuda only
  AttentionChoice attention = AttentionChoice::kAuto;        // cuda bf16 only
  // cuda only: where the backend's activations and the backward's scratch live (the placement's
  // kinds; the CPU backend's memory is the host's).
  MemoryKind activations_kind = MemoryKind::kDevice;
  MemoryKind scratch_kind = MemoryKind::kDevice;
  // cuda bf16 only: per span whether its compute copy is a ring slot the schedule places
  // (streamed blocks, schedule/weight_ring.h): the backend's weights region leaves it out.
  std::vector<char> compute_copy_elsewhere{};
};

// Resolves "auto": cuda with bf16 where this build has the CUDA backend and a GPU is usable,
// otherwise cpu with fp32. Throws layup::Error for a target this build or machine cannot run,
// saying why and what to use instead.
ComputeTarget resolve_compute_target(const ComputeTarget& requested);

// Data parallel: this process takes GPU `local_rank` of its host for the rest of the run (where a
// GPU is usable; nothing otherwise). Call it before anything else touches CUDA.
void use_gpu_of_local_rank(int local_rank);

struct BackendAndDevice {
  std::unique_ptr<ModelBackend> backend;
  std::unique_ptr<Device> device;
  std::shared_ptr<MemoryAccountant> accountant;  // the ledger both record their memory into
};

// Builds the backend for a resolved target, sized for max_batch x max_seq_len. Device and backend
// record their allocations into `accountant` (null: a new one, returned in the result).
// The memory attributes of a resolved device: the CPU backend's, or the GPU's as its driver
// reports them (where this build has no CUDA backend or no GPU is usable: a discrete GPU's,
// assumed, which the plan says).
DeviceMemoryAttributes memory_attributes_of(DeviceKind device);

// The kinds the device of a resolved DeviceKind hands out (Device::kinds), known before it exists:
// host memory on the CPU backend; device memory and pinned host memory on CUDA.
DeviceKinds device_kinds_of(DeviceKind device);

BackendAndDevice make_backend(const ComputeTarget& target, const ModelConfig& config, int max_batch,
                              int max_seq_len,
                              std::shared_ptr<MemoryAccountant> accountant = nullptr);

}  // namespace layup
