// RMS normalization over the last dimension on the GPU (Llama's RMSNorm). Same math as the CPU op
// (backend/cpu/ops/rmsnorm.h). Activations and weight are T (float or __nv_bfloat16); rstd and
// the weight gradient are fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/ops/scratch_floats.h"
#include "backend/cuda/ops/weight_gradient.cuh"

namespace layup::cuda {

// out[n,:] = inp[n,:] * rstd[n] * weight, rstd = 1 / sqrt(mean_c(inp[n,c]^2) + eps). Writes out
// [N,C] and saves rstd [N] for the backward.
template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream);

// Floats of scratch rmsnorm_backward needs for N rows of width C.
inline size_t rmsnorm_backward_scratch_floats(int N, int C) {
  return column_reduce_scratch_floats(N, C, 1);
}

// Accumulates dinp [N,C] from dout [N,C] using the saved rstd, and adds to or overwrites
// dweight [C] as dweight_mode says (a deterministic sum over rows, no atomics).
template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, WeightGradient dweight_mode, float* scratch,
                      cudaStream_t stream);

}  // namespace layup::cuda
