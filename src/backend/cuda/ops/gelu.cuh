// GELU, tanh approximation (GPT-2's gelu_new), on the GPU. Same math as the CPU op
// (backend/cpu/ops/gelu.h); T is float or __nv_bfloat16, computed in fp32.
#pragma once

#include <cuda_runtime_api.h>

namespace layup::cuda {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over N values.
template <class T>
void gelu_forward(T* out, const T* inp, int N, cudaStream_t stream);

// Accumulates dinp += gelu'(inp) * dout, elementwise over N values.
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int N, cudaStream_t stream);

}  // namespace layup::cuda
