// SwiGLU, forward and backward. With s = sigmoid(g) and y = g s u:
//
//   dy/du = g s        dy/dg = u s (1 + g (1 - s))
//
// Elementwise over the [N, I] outputs; each thread reads its gate and up from the two halves of
// the row. expf is the accurate one, so fp32 results track the CPU op to a few ulp.
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/swiglu.cuh"

namespace layup::cuda {
namespace {

// From e = exp(-|g|) <= 1, as the CPU op: never an exp that overflows.
__device__ inline float sigmoid(float g) {
  const float e = expf(-fabsf(g));
  const float inv = 1.0f / (1.0f + e);
  return g >= 0.0f ? inv : e * inv;
}

// Output element i = (n, c) of [N, I]: its gate's index in gate_up [N, 2I]; its up is I further.
__device__ inline size_t gate_index(size_t i, int I) {
  return i / I * 2 * I + i % I;
}

template <class T>
struct SwigluForward {
  T* out;
  const T* gate_up;
  int I;
  template <int K>
  __device__ void apply(size_t i) const {
    static_assert(K == 1, "rows of I elements need not align to packs");
    const size_t gate = gate_index(i, I);
    const float g = to_float(gate_up[gate]), u = to_float(gate_up[gate + I]);
    out[i] = from_float<T>(g * sigmoid(g) * u);
  }
};

template <class T>
struct SwigluBackward {
  T* dgate_up;
  const T* dout;
  const T* gate_up;
  int I;
  template <int K>
  __device__ void apply(size_t i) const {
    static_assert(K == 1, "rows of I elements need not align to packs");
    const size_t gate = gate_index(i, I), up = gate + I;
    const float g = to_float(gate_up[gate]), u = to_float(gate_up[up]), dy = to_float(dout[i]);
    const float s = sigmoid(g);
    dgate_up[gate] = from_float<T>(to_float(dgate_up[gate]) + dy * u * s * (1.0f + g * (1.0f - s)));
    dgate_up[up] = from_float<T>(to_float(dgate_up[up]) + dy * g * s);
  }
};

}  // namespace

template <class T>
void swiglu_forward(T* out, const T* gate_up, int N, int I, cudaStream_t stream) {
  launch_elementwise<1>(static_cast<size_t>(N) * I, false, SwigluForward<T>{out, gate_up, I},
                        stream);
}

template <class T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int N, int I,
                     cudaStream_t stream) {
  launch_elementwise<1>(static_cast<size_t>(N) * I, false,
                        SwigluBackward<T>{dgate_up, dout, gate_up, I}, stream);
}

template void swiglu_forward<float>(float*, const float*, int, int, cudaStream_t);
template void swiglu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int, int,
                                            cudaStream_t);
template void swiglu_backward<float>(float*, const float*, const float*, int, int, cudaStream_t);
template void swiglu_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, int, int, cudaStream_t);

}  // namespace layup::cuda
