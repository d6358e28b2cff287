// What each backend allocates for a model at max_batch x max_seq_len, computed without
// allocating: the numbers behind the memory plan (memory/memory_plan.h).
//
// These mirror the constructors they describe and must change with them:
//  - cpu_backend_memory: the std::vectors of CpuBackend's constructor
//  (backend/cpu/cpu_backend.cpp).
//  - cuda_arena_bytes: CudaBackend<T>::carve (backend/cuda/cuda_backend.cu), the three
//    allocations (one per class: the bf16 compute copy of the weights, the activations, the ops'
//    scratch) cut into 256-byte aligned pieces; the CUDA backend records each region's measured
//    size in the accountant, and a CUDA test compares them with this.
//  - the constants below: the cuBLASLt workspace (ops/matmul.cu uses this constant), the CUDA
//    device's sum-of-squares partials, the CUDA backend's pinned staging.
#pragma once

#include <cstddef>

#include "model/gpt2_config.h"

namespace layup {

// Bytes by class. weights is the bf16 compute copy (CUDA bf16 only); activations are what the
// forward keeps for the backward (and the batch's token ids, targets and logits); scratch is the
// activation gradients and the ops' scratch.
struct BackendBytes {
  size_t weights = 0;
  size_t activations = 0;
  size_t scratch = 0;
  size_t total() const { return weights + activations + scratch; }
};

// The CPU backend's activation and scratch vectors (host memory).
BackendBytes cpu_backend_memory(const Gpt2Config& config, int max_batch, int max_seq_len);

// The CUDA backend's regions by class (alignment padding goes to the piece it precedes), for
// bf16 or fp32 compute at a --recompute level (0, 1 or 2; see backend/cuda/cuda_backend.h).
BackendBytes cuda_arena_bytes(const Gpt2Config& config, int max_batch, int max_seq_len, bool bf16,
                              int recompute);

// cuBLASLt's workspace: one device allocation per backend (cuBLAS's recommendation for Hopper).
constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;
// The CUDA device's partial sums of the gradient norm: 1024 doubles.
constexpr size_t kCudaDeviceScratchBytes = 1024 * sizeof(double);
// The CUDA backend's pinned host staging: five int32 arrays of B*T (+1) for the token ids,
// targets and the embedding backward's grouping, and the B*T losses coming back.
size_t cuda_pinned_staging_bytes(int max_batch, int max_seq_len);

}  // namespace layup
