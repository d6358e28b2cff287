// RMS normalization, forward and backward.
//
// For one row, with xhat_c = x_c * rstd, y_c = xhat_c * w_c and g_c = dy_c * w_c:
//
//   dw_c += dy_c * xhat_c          dL/dx_j = rstd (g_j - xhat_j mean_c(g_c xhat_c))
//
// (rstd = (mean(x^2) + eps)^(-1/2), so d rstd / d x_j = -rstd^3 x_j / C; see
// backend/cpu/ops/rmsnorm.cpp). One warp owns one row: a pass for the sum of squares, a pass to
// write; the row stays in L1 between them. dweight goes through the deterministic column sums of
// common.cuh.
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/rmsnorm.cuh"

namespace layup::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, int N, int C,
                           float eps) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + static_cast<size_t>(n) * C;
  float squares = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float v = to_float(x[c]);
    squares += v * v;
  }
  const float s = rsqrtf(warp_sum(squares) / C + eps);
  T* y = out + static_cast<size_t>(n) * C;
  for (int c = lane; c < C; c += 32) y[c] = from_float<T>(to_float(x[c]) * s * to_float(weight[c]));
  if (lane == 0) rstd[n] = s;
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    rmsnorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                  const float* rstd, int N, int C) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const size_t row = static_cast<size_t>(n) * C;
  const float s = rstd[n];
  float g_xhat = 0.0f;
  for (int c = lane; c < C; c += 32)
    g_xhat += to_float(dout[row + c]) * to_float(weight[c]) * to_float(inp[row + c]) * s;
  const float mean_g_xhat = warp_sum(g_xhat) / C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = to_float(inp[row + c]) * s;
    const float g = to_float(dout[row + c]) * to_float(weight[c]);
    dinp[row + c] = from_float<T>(to_float(dinp[row + c]) + s * (g - xhat * mean_g_xhat));
  }
}

// Row n's contribution to column c of dweight: dy * xhat.
template <class T>
struct RmsNormWeightTerm {
  const T* dout;
  const T* inp;
  const float* rstd;
  int C;
  template <int K>
  __device__ void at(int n, int c, float (&values)[1][K]) const {
    const size_t i = static_cast<size_t>(n) * C + c;
    float dy[K], x[K];
    load_floats<K>(dout + i, dy);
    load_floats<K>(inp + i, x);
#pragma unroll
    for (int k = 0; k < K; ++k) values[0][k] = dy[k] * (x[k] * rstd[n]);
  }
};

}  // namespace

template <class T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  rmsnorm_forward_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      out, rstd, inp, weight, N, C, eps);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template <class T>
void rmsnorm_backward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                      const float* rstd, int N, int C, WeightGradient dweight_mode, float* scratch,
                      cudaStream_t stream) {
  rmsnorm_backward_input_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      dinp, dout, inp, weight, rstd, N, C);
  LAYUP_CUDA_CHECK_LAUNCH();
  column_sums<1, Pack<T>::kSize>(ColumnOutputs<1>{{dweight}}, N, C,
                                 RmsNormWeightTerm<T>{dout, inp, rstd, C},
                                 C % Pack<T>::kSize == 0 && is_aligned16(dout) && is_aligned16(inp),
                                 dweight_mode, scratch, stream);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float,
                                     cudaStream_t);
template void rmsnorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                             const __nv_bfloat16*, int, int, float, cudaStream_t);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int, WeightGradient, float*, cudaStream_t);
template void rmsnorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, const __nv_bfloat16*,
                                              const float*, int, int, WeightGradient, float*,
                                              cudaStream_t);

}  // namespace layup::cuda
