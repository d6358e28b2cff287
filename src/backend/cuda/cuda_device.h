// The CUDA device as the schedules see it (backend/device.h): cudaMalloc'd memory, copies, and the
// optimizer step's two bulk operations as kernels (deterministic sum of squares, fused AdamW).
//
// Plain C++ header: callers need no CUDA headers.
//
// Ordering: the device's work runs on CUDA's legacy default stream, and the CUDA backend's stream
// is a blocking stream, which the legacy stream synchronizes with in both directions. So a schedule
// may call the device and the backend in program order (zero the gradients, run backward, take the
// norm, update) and each step sees the one before it, with no events to manage. The overlapping
// copies are the exception, by design: copy_to_host_after and copy_to_device_async run on two
// non-blocking copy streams (one per direction), ordered by their fence (an event recorded on the
// legacy stream) and nothing else. allocate_host hands out pinned, mapped host memory
// (cudaHostAlloc), so those copies are asynchronous DMA transfers.
#pragma once

#include <memory>
#include <string>

#include "backend/device.h"
#include "memory/device_attributes.h"

namespace layup {

// True when a CUDA GPU is present and can run this build's kernels. Otherwise false, and *why
// (when not null) says what is missing, e.g. for a test's skip message.
bool cuda_device_available(std::string* why);

// Makes GPU `local_rank` (of those visible) this process's for every CUDA call after it: one GPU
// per rank of a data-parallel run on a host; nothing where no GPU is visible. Throws layup::Error
// where the host has fewer GPUs than ranks. Call it before any other CUDA call.
void use_cuda_device_of_local_rank(int local_rank);
// LAYUP_RANKS_SHARE_GPUS (set once, before the ranks pick their GPUs): more ranks on a host than
// it has GPUs take them in turn (local rank modulo the count), so several ranks can be checked on
// one GPU. NCCL needs a GPU a rank: a run that sums on the device there is refused, saying so.
void set_ranks_share_cuda_devices(bool share);

// CUDA device 0's memory attributes as the driver reports them (the first GPU
// CUDA_VISIBLE_DEVICES leaves); without a usable GPU, assumed_cuda_memory_attributes().
DeviceMemoryAttributes read_cuda_memory_attributes();

// Device 0 (or the one CUDA_VISIBLE_DEVICES leaves first), recording its memory into
// `accountant` (null: a ledger of its own). Throws layup::Error when there is no usable GPU.
std::unique_ptr<Device> make_cuda_device(std::shared_ptr<MemoryAccountant> accountant = nullptr);

}  // namespace layup
