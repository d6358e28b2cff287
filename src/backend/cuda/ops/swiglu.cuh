// SwiGLU, the gated activation of Llama's MLP, on the GPU. Same math as the CPU op
// (backend/cpu/ops/swiglu.h): gate_up [N, 2I] holds gate in channels [0, I) and up in [I, 2I) of
// each row; T is float or __nv_bfloat16, computed in fp32.
#pragma once

#include <cuda_runtime_api.h>

namespace layup::cuda {

// out [N, I]: out[n,i] = silu(gate[n,i]) * up[n,i], silu(g) = g * sigmoid(g).
template <class T>
void swiglu_forward(T* out, const T* gate_up, int N, int I, cudaStream_t stream);

// Accumulates dgate_up [N, 2I] (both halves) from dout [N, I], using gate_up.
template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int I,
                     cudaStream_t stream);

}  // namespace layup::cuda
