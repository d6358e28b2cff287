// Layer normalization over the last dimension on the GPU (biased variance, as nn.LayerNorm). Same
// math as the CPU op (backend/cpu/ops/layernorm.h). Activations, weight and bias are T (float or
// __nv_bfloat16); the statistics and the weight gradients are fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/ops/scratch_floats.h"
#include "backend/cuda/ops/weight_gradient.cuh"

namespace layup::cuda {

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias, rstd = 1 / sqrt(var + eps).
// Writes out [N,C] and saves mean [N], rstd [N] for the backward.
template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C, float eps, cudaStream_t stream);

// The residual add that precedes every layer norm of GPT-2's pre-LN blocks, fused with it:
// residual_out = x + branch (rounded to T, as residual_forward stores it), then layernorm_forward
// of residual_out. One pass over the rows instead of two; the same results as residual_forward
// followed by layernorm_forward.
template <class T>
void residual_layernorm_forward(T* residual_out, T* out, float* mean, float* rstd, const T* x,
                                const T* branch, const T* weight, const T* bias, int N, int C,
                                float eps, cudaStream_t stream);

// Floats of scratch layernorm_backward needs for N rows of width C:
// layernorm_backward_scratch_floats (scratch_floats.h).

// Accumulates dinp [N,C] from dout [N,C], using the saved mean and rstd, and adds to or
// overwrites dweight [C] and dbias [C] as dweight_mode says: sums over rows, computed
// deterministically (no atomics).
template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int N, int C,
                        WeightGradient dweight_mode, float* scratch, cudaStream_t stream);

}  // namespace layup::cuda
