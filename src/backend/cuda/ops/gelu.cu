// GELU (tanh approximation), forward and backward.
//
// With u = k (x + 0.044715 x^3), k = sqrt(2/pi), and y = 0.5 x (1 + tanh u):
//
//   dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3 * 0.044715 x^2)
//
// Memory-bound: one 16-byte load per input and store per output where the buffers are aligned.
// tanhf is the accurate one (not tanh.approx), so fp32 results track the CPU op to ~1 ulp.
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/gelu.cuh"

namespace layup::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ inline float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

__device__ inline float gelu_derivative(float x) {
  const float tanh_u = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + tanh_u) +
         0.5f * x * (1.0f - tanh_u * tanh_u) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
}

template <class T>
struct GeluForward {
  T* out;
  const T* inp;
  template <int K>
  __device__ void apply(size_t i) const {
    float x[K], y[K];
    load_floats<K>(inp + i, x);
#pragma unroll
    for (int j = 0; j < K; ++j) y[j] = gelu(x[j]);
    store_floats<K>(out + i, y);
  }
};

template <class T>
struct GeluBackward {
  T* dinp;
  const T* inp;
  const T* dout;
  template <int K>
  __device__ void apply(size_t i) const {
    float x[K], dy[K], dx[K];
    load_floats<K>(inp + i, x);
    load_floats<K>(dout + i, dy);
    load_floats<K>(dinp + i, dx);
#pragma unroll
    for (int j = 0; j < K; ++j) dx[j] += gelu_derivative(x[j]) * dy[j];
    store_floats<K>(dinp + i, dx);
  }
};

}  // namespace

template <class T>
void gelu_forward(T* out, const T* inp, int N, cudaStream_t stream) {
  launch_elementwise<Pack<T>::kSize>(N, is_aligned16(out) && is_aligned16(inp),
                                     GeluForward<T>{out, inp}, stream);
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int N, cudaStream_t stream) {
  launch_elementwise<Pack<T>::kSize>(N,
                                     is_aligned16(dinp) && is_aligned16(inp) && is_aligned16(dout),
                                     GeluBackward<T>{dinp, inp, dout}, stream);
}

template void gelu_forward<float>(float*, const float*, int, cudaStream_t);
template void gelu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int, cudaStream_t);
template void gelu_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                           const __nv_bfloat16*, int, cudaStream_t);

}  // namespace layup::cuda
