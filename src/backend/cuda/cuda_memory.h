// Memory of a placement kind on CUDA (memory/tensor_class.h), for the device's buffers and the
// backend's regions (weights, activations, scratch) alike: device (cudaMalloc), pinned
// (cudaHostAlloc, mapped: the GPU reads and writes it in place over the interconnect), managed
// (cudaMallocManaged, refused beyond the GPU's free memory, which on a shared GPU could hang every
// user), pageable and host (plain 64-byte aligned host memory; the GPU reaches pageable memory only
// where it reports pageable memory access, which the memory plan checks before anything is
// allocated).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "memory/memory_accountant.h"
#include "memory/planned_allocation.h"
#include "memory/tensor_class.h"

namespace layup {

// `bytes` of zeroed memory of `kind` (device memory is zeroed on the legacy stream, in order with
// the work after it). `what` names the contents for the error a user sees ("weight grads",
// "activations"). Throws layup::Error when the memory cannot be had, saying what to change.
void* cuda_allocate(size_t bytes, MemoryKind kind, const std::string& what);

// Frees what cuda_allocate returned as `kind`. Never throws: a failure is reported on stderr.
void cuda_free(void* data, MemoryKind kind) noexcept;

// cuda_allocate's memory, freed as its kind says when the pointer goes.
struct CudaFree {
  MemoryKind kind = MemoryKind::kDevice;
  void operator()(void* data) const noexcept { cuda_free(data, kind); }
};
using CudaAllocation = std::unique_ptr<void, CudaFree>;

// A listed buffer (cuda_backend_buffers.h) allocated as listed: its bytes of its kind. `context`
// follows its `what` in the error a user sees (" at B=8, T=1024").
inline CudaAllocation cuda_allocate(const PlannedAllocation& planned, const std::string& context) {
  return CudaAllocation(cuda_allocate(planned.bytes, planned.kind, planned.what + context),
                        CudaFree{planned.kind});
}

}  // namespace layup
