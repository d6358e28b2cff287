// Memory of a placement kind on CUDA (memory/tensor_class.h), for the device's buffers and the
// backend's regions (weights, activations, scratch) alike: device (cudaMalloc), pinned
// (cudaHostAlloc, mapped: the GPU reads and writes it in place over the interconnect), managed
// (cudaMallocManaged, refused beyond the GPU's free memory, which on a shared GPU could hang every
// user), pageable and host (plain 64-byte aligned host memory; the GPU reaches pageable memory only
// where it reports pageable memory access, which the memory plan checks before anything is
// allocated).
#pragma once

#include <cstddef>
#include <string>

#include "memory/tensor_class.h"

namespace layup {

// `bytes` of zeroed memory of `kind` (device memory is zeroed on the legacy stream, in order with
// the work after it). `what` names the contents for the error a user sees ("weight grads",
// "activations"). Throws layup::Error when the memory cannot be had, saying what to change.
void* cuda_allocate(size_t bytes, MemoryKind kind, const std::string& what);

// Frees what cuda_allocate returned as `kind`. Never throws: a failure is reported on stderr.
void cuda_free(void* data, MemoryKind kind) noexcept;

}  // namespace layup
