// Layer normalization, forward and backward.
//
// Derivation of the backward, for one row (dropping n), with xhat_c = (x_c - mean) * rstd and
// y_c = xhat_c * w_c + b_c:
//
//   db_c += dy_c                 dw_c += dy_c * xhat_c              g_c = dy_c * w_c (= dL/dxhat_c)
//   dL/dx_j = rstd (g_j - mean_c(g_c) - xhat_j mean_c(g_c xhat_c))
//
// (see backend/cpu/ops/layernorm.cpp for the steps). One warp owns one row: it reads the row a
// first time for the mean, a second time for the variance around that mean (two passes, so a large
// mean does not cancel the variance away), and a third time to write; the row (a few KB) stays in
// L1 between the passes. dweight and dbias sum over rows and go through the deterministic column
// reduction of common.cuh.
#include <cuda_bf16.h>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/layernorm.cuh"

namespace layup::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                             const T* bias, int N, int C, float eps) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + static_cast<size_t>(n) * C;

  float sum = 0.0f;
  for (int c = lane; c < C; c += 32) sum += to_float(x[c]);
  const float m = warp_sum(sum) / C;
  float squares = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float centered = to_float(x[c]) - m;
    squares += centered * centered;
  }
  const float s = 1.0f / sqrtf(warp_sum(squares) / C + eps);

  T* y = out + static_cast<size_t>(n) * C;
  for (int c = lane; c < C; c += 32)
    y[c] = from_float<T>((to_float(x[c]) - m) * s * to_float(weight[c]) + to_float(bias[c]));
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layernorm_backward_input_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                    const float* mean, const float* rstd, int N, int C) {
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + static_cast<size_t>(n) * C;
  const T* dy = dout + static_cast<size_t>(n) * C;
  const float m = mean[n], s = rstd[n];

  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float g = to_float(dy[c]) * to_float(weight[c]);
    sum_g += g;
    sum_g_xhat += g * ((to_float(x[c]) - m) * s);
  }
  const float mean_g = warp_sum(sum_g) / C;
  const float mean_g_xhat = warp_sum(sum_g_xhat) / C;

  T* dx = dinp + static_cast<size_t>(n) * C;
  for (int c = lane; c < C; c += 32) {
    const float xhat = (to_float(x[c]) - m) * s;
    const float g = to_float(dy[c]) * to_float(weight[c]);
    dx[c] = from_float<T>(to_float(dx[c]) + s * (g - mean_g - xhat * mean_g_xhat));
  }
}

// Row n's contributions to column c of dweight and dbias.
template <class T>
struct LayerNormParameterTerms {
  const T* dout;
  const T* inp;
  const float* mean;
  const float* rstd;
  int C;
  __device__ void operator()(int n, int c, float (&values)[2]) const {
    const size_t i = static_cast<size_t>(n) * C + c;
    const float dy = to_float(dout[i]);
    values[0] = dy * ((to_float(inp[i]) - mean[n]) * rstd[n]);
    values[1] = dy;
  }
};

}  // namespace

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C, float eps, cudaStream_t stream) {
  layernorm_forward_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, N, C, eps);
  LAYUP_CUDA_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_floats(int N, int C) {
  return column_reduce_scratch_floats(N, C, 2);
}

template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int N, int C,
                        float* scratch, cudaStream_t stream) {
  layernorm_backward_input_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      dinp, dout, inp, weight, mean, rstd, N, C);
  LAYUP_CUDA_CHECK_LAUNCH();
  column_sums_accumulate<2>(ColumnOutputs<2>{{dweight, dbias}}, N, C,
                            LayerNormParameterTerms<T>{dout, inp, mean, rstd, C}, scratch, stream);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int, int, float, cudaStream_t);
template void layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                                               float, cudaStream_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int, float*,
                                        cudaStream_t);
template void layernorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*,
                                                const __nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const float*, const float*,
                                                int, int, float*, cudaStream_t);

}  // namespace layup::cuda
