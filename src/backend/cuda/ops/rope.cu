// Rotary position embeddings: one thread per pair (row, head, i), which it reads, turns and writes
// back; pairs are independent, so in place is safe. sign = +1 turns forward, -1 back (R(a)^T =
// R(-a): the derivation is in backend/cpu/ops/rope.cpp).
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/rope.cuh"

namespace layup::cuda {
namespace {

template <class T>
__global__ void rope_kernel(T* rows, const float* cos, const float* sin, int T_, int heads,
                            int half, int row_stride, size_t pairs, float sign) {
  for (size_t p = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const size_t head_row = p / half;
    const int head = static_cast<int>(head_row % heads);
    const size_t row = head_row / heads;
    const int t = static_cast<int>(row % T_);
    T* x = rows + row * row_stride + static_cast<size_t>(head) * 2 * half;
    const float c = cos[static_cast<size_t>(t) * half + i];
    const float s = sign * sin[static_cast<size_t>(t) * half + i];
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    x[i] = from_float<T>(x1 * c - x2 * s);
    x[i + half] = from_float<T>(x2 * c + x1 * s);
  }
}

template <class T>
void rope(T* rows, const float* cos, const float* sin, int B, int T_, int heads, int head_dim,
          int row_stride, float sign, cudaStream_t stream) {
  const int half = head_dim / 2;
  const size_t pairs = static_cast<size_t>(B) * T_ * heads * half;
  constexpr int kThreads = 256;
  rope_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(rows, cos, sin, T_, heads, half,
                                                                  row_stride, pairs, sign);
  LAYUP_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class T>
void rope_forward(T* rows, const float* cos, const float* sin, int B, int T_, int heads,
                  int head_dim, int row_stride, cudaStream_t stream) {
  rope(rows, cos, sin, B, T_, heads, head_dim, row_stride, 1.0f, stream);
}

template <class T>
void rope_backward(T* rows, const float* cos, const float* sin, int B, int T_, int heads,
                   int head_dim, int row_stride, cudaStream_t stream) {
  rope(rows, cos, sin, B, T_, heads, head_dim, row_stride, -1.0f, stream);
}

template void rope_forward<float>(float*, const float*, const float*, int, int, int, int, int,
                                  cudaStream_t);
template void rope_forward<__nv_bfloat16>(__nv_bfloat16*, const float*, const float*, int, int, int,
                                          int, int, cudaStream_t);
template void rope_backward<float>(float*, const float*, const float*, int, int, int, int, int,
                                   cudaStream_t);
template void rope_backward<__nv_bfloat16>(__nv_bfloat16*, const float*, const float*, int, int,
                                           int, int, int, cudaStream_t);

}  // namespace layup::cuda
