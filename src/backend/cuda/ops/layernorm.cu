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
#include "backend/cuda/ops/residual.cuh"

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

// The second and third passes of a packed row (one warp, K = one 16-byte pack per lane and step),
// given the lane's part of the row's sum: variance around the mean, then the normalized,
// scaled and shifted row. Each lane reads only packs it read (or wrote) in the first pass.
template <class T>
__device__ void layernorm_row_packed(T* y, float* mean, float* rstd, const T* x, const T* weight,
                                     const T* bias, int n, int C, float eps, float lane_sum) {
  constexpr int K = Pack<T>::kSize;
  const int lane = threadIdx.x % 32;
  const float m = warp_sum(lane_sum) / C;
  float squares = 0.0f;
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K];
    load_floats<K>(x + c, xs);
#pragma unroll
    for (int i = 0; i < K; ++i) squares += (xs[i] - m) * (xs[i] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(squares) / C + eps);
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K], ws[K], bs[K];
    load_floats<K>(x + c, xs);
    load_floats<K>(weight + c, ws);
    load_floats<K>(bias + c, bs);
#pragma unroll
    for (int i = 0; i < K; ++i) xs[i] = (xs[i] - m) * s * ws[i] + bs[i];
    store_floats<K>(y + c, xs);
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = s;
  }
}

// The same as layernorm_forward_kernel, 16 bytes at a time, for widths that are a multiple of a
// pack (every GPT-2 width) on 16-byte aligned rows.
template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layernorm_forward_packed_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                                    const T* bias, int N, int C, float eps) {
  constexpr int K = Pack<T>::kSize;
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const size_t row = static_cast<size_t>(n) * C;
  float sum = 0.0f;
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K];
    load_floats<K>(inp + row + c, xs);
#pragma unroll
    for (int i = 0; i < K; ++i) sum += xs[i];
  }
  layernorm_row_packed(out + row, mean, rstd, inp + row, weight, bias, n, C, eps, sum);
}

// residual_out = x + branch, then the packed layer norm of it. The sum is rounded to T before the
// statistics, so the result is what the unfused pair computes; the row stays in L1 between the
// passes.
template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    residual_layernorm_forward_kernel(T* residual_out, T* out, float* mean, float* rstd,
                                      const T* x_in, const T* branch, const T* weight,
                                      const T* bias, int N, int C, float eps) {
  constexpr int K = Pack<T>::kSize;
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const size_t row = static_cast<size_t>(n) * C;
  float sum = 0.0f;
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K], bs[K];
    load_floats<K>(x_in + row + c, xs);
    load_floats<K>(branch + row + c, bs);
    Pack<T> rounded;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      rounded.v[i] = from_float<T>(xs[i] + bs[i]);
      sum += to_float(rounded.v[i]);
    }
    store_pack(residual_out + row + c, rounded);
  }
  layernorm_row_packed(out + row, mean, rstd, residual_out + row, weight, bias, n, C, eps, sum);
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

// The same, 16 bytes at a time (8 bf16 or 4 floats per load): for rows whose width is a multiple
// of a pack and whose pointers are 16-byte aligned, which is every GPT-2 width. The element-wise
// kernel above reads 2 or 4 bytes per lane per load; this one reaches several times the bandwidth.
template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    layernorm_backward_input_packed_kernel(T* dinp, const T* dout, const T* inp, const T* weight,
                                           const float* mean, const float* rstd, int N, int C) {
  constexpr int K = Pack<T>::kSize;
  const int n = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const T* x = inp + static_cast<size_t>(n) * C;
  const T* dy = dout + static_cast<size_t>(n) * C;
  const float m = mean[n], s = rstd[n];

  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K], dys[K], ws[K];
    load_floats<K>(x + c, xs);
    load_floats<K>(dy + c, dys);
    load_floats<K>(weight + c, ws);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const float g = dys[i] * ws[i];
      sum_g += g;
      sum_g_xhat += g * ((xs[i] - m) * s);
    }
  }
  const float mean_g = warp_sum(sum_g) / C;
  const float mean_g_xhat = warp_sum(sum_g_xhat) / C;

  T* dx = dinp + static_cast<size_t>(n) * C;
  for (int c = lane * K; c < C; c += 32 * K) {
    float xs[K], dys[K], ws[K], dxs[K];
    load_floats<K>(x + c, xs);
    load_floats<K>(dy + c, dys);
    load_floats<K>(weight + c, ws);
    load_floats<K>(dx + c, dxs);
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const float xhat = (xs[i] - m) * s;
      dxs[i] += s * (dys[i] * ws[i] - mean_g - xhat * mean_g_xhat);
    }
    store_floats<K>(dx + c, dxs);
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
  template <int K>
  __device__ void at(int n, int c, float (&values)[2][K]) const {
    const size_t i = static_cast<size_t>(n) * C + c;
    float dy[K], x[K];
    load_floats<K>(dout + i, dy);
    load_floats<K>(inp + i, x);
    const float m = mean[n], s = rstd[n];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      values[0][k] = dy[k] * ((x[k] - m) * s);
      values[1][k] = dy[k];
    }
  }
};

}  // namespace

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                       const T* bias, int N, int C, float eps, cudaStream_t stream) {
  const bool packed = C % Pack<T>::kSize == 0 && is_aligned16(out) && is_aligned16(inp) &&
                      is_aligned16(weight) && is_aligned16(bias);
  if (packed) {
    layernorm_forward_packed_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                      stream>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  } else {
    layernorm_forward_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
        out, mean, rstd, inp, weight, bias, N, C, eps);
  }
  LAYUP_CUDA_CHECK_LAUNCH();
}

template <class T>
void residual_layernorm_forward(T* residual_out, T* out, float* mean, float* rstd, const T* x,
                                const T* branch, const T* weight, const T* bias, int N, int C,
                                float eps, cudaStream_t stream) {
  const bool packed = C % Pack<T>::kSize == 0 && is_aligned16(residual_out) && is_aligned16(out) &&
                      is_aligned16(x) && is_aligned16(branch) && is_aligned16(weight) &&
                      is_aligned16(bias);
  if (!packed) {
    residual_forward(residual_out, x, branch, N * C, stream);
    layernorm_forward(out, mean, rstd, residual_out, weight, bias, N, C, eps, stream);
    return;
  }
  residual_layernorm_forward_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                      stream>>>(residual_out, out, mean, rstd, x, branch, weight,
                                                bias, N, C, eps);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template <class T>
void layernorm_backward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                        const T* weight, const float* mean, const float* rstd, int N, int C,
                        WeightGradient dweight_mode, float* scratch, cudaStream_t stream) {
  const bool packed = C % Pack<T>::kSize == 0 && is_aligned16(dinp) && is_aligned16(dout) &&
                      is_aligned16(inp) && is_aligned16(weight);
  if (packed) {
    layernorm_backward_input_packed_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                             stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  } else {
    layernorm_backward_input_kernel<<<ceil_div(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                                      stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  LAYUP_CUDA_CHECK_LAUNCH();
  column_sums<2, Pack<T>::kSize>(ColumnOutputs<2>{{dweight, dbias}}, N, C,
                                 LayerNormParameterTerms<T>{dout, inp, mean, rstd, C},
                                 is_aligned16(dout) && is_aligned16(inp), dweight_mode, scratch,
                                 stream);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, int, int, float, cudaStream_t);
template void layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                                               float, cudaStream_t);
template void residual_layernorm_forward<float>(float*, float*, float*, float*, const float*,
                                                const float*, const float*, const float*, int, int,
                                                float, cudaStream_t);
template void residual_layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, float*,
                                                        float*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, int, int, float,
                                                        cudaStream_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const float*, int, int,
                                        WeightGradient, float*, cudaStream_t);
template void layernorm_backward<__nv_bfloat16>(__nv_bfloat16*, float*, float*,
                                                const __nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const float*, const float*,
                                                int, int, WeightGradient, float*, cudaStream_t);

}  // namespace layup::cuda
