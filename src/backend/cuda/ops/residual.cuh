// Residual connection on the GPU. Same math as the CPU op (backend/cpu/ops/residual.h); T is float
// or __nv_bfloat16, added in fp32.
#pragma once

#include <cuda_runtime_api.h>

namespace layup::cuda {

// out = inp1 + inp2, elementwise over N values.
template <class T>
void residual_forward(T* out, const T* inp1, const T* inp2, int N, cudaStream_t stream);

// A sum passes its gradient to both inputs unchanged: dinp1 += dout, dinp2 += dout.
template <class T>
void residual_backward(T* dinp1, T* dinp2, const T* dout, int N, cudaStream_t stream);

}  // namespace layup::cuda
