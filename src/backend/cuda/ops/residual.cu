// Residual connection, forward and backward: memory-bound elementwise kernels, 16-byte accesses
// where the buffers are aligned.
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/residual.cuh"

namespace layup::cuda {
namespace {

template <class T>
struct ResidualForward {
  T* out;
  const T* inp1;
  const T* inp2;
  template <int K>
  __device__ void apply(size_t i) const {
    float a[K], b[K], sum[K];
    load_floats<K>(inp1 + i, a);
    load_floats<K>(inp2 + i, b);
#pragma unroll
    for (int j = 0; j < K; ++j) sum[j] = a[j] + b[j];
    store_floats<K>(out + i, sum);
  }
};

template <class T>
struct ResidualBackward {
  T* dinp1;
  T* dinp2;
  const T* dout;
  template <int K>
  __device__ void apply(size_t i) const {
    float dy[K], d1[K], d2[K];
    load_floats<K>(dout + i, dy);
    load_floats<K>(dinp1 + i, d1);
    load_floats<K>(dinp2 + i, d2);
#pragma unroll
    for (int j = 0; j < K; ++j) {
      d1[j] += dy[j];
      d2[j] += dy[j];
    }
    store_floats<K>(dinp1 + i, d1);
    store_floats<K>(dinp2 + i, d2);
  }
};

}  // namespace

template <class T>
void residual_forward(T* out, const T* inp1, const T* inp2, int N, cudaStream_t stream) {
  launch_elementwise<Pack<T>::kSize>(N,
                                     is_aligned16(out) && is_aligned16(inp1) && is_aligned16(inp2),
                                     ResidualForward<T>{out, inp1, inp2}, stream);
}

template <class T>
void residual_backward(T* dinp1, T* dinp2, const T* dout, int N, cudaStream_t stream) {
  launch_elementwise<Pack<T>::kSize>(
      N, is_aligned16(dinp1) && is_aligned16(dinp2) && is_aligned16(dout),
      ResidualBackward<T>{dinp1, dinp2, dout}, stream);
}

template void residual_forward<float>(float*, const float*, const float*, int, cudaStream_t);
template void residual_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, int, cudaStream_t);
template void residual_backward<float>(float*, float*, const float*, int, cudaStream_t);
template void residual_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                               int, cudaStream_t);

}  // namespace layup::cuda
