// Attention against a key/value cache on the GPU. One block per (new position, query head); its
// warps take the cached positions in turn, each lane holding D/32 channels of q and of the running
// output. Each warp keeps an online softmax (running maximum m, sum s, output scaled to m):
//
//   m' = max(m, x),  s' = s e^(m - m') + e^(x - m'),  o' = o e^(m - m') + e^(x - m') v,
//
// and the warps' partial results merge the same way at the end: out = sum_w o_w e^(m_w - M) /
// sum_w s_w e^(m_w - M), M the largest m_w. Generation reads one new position per call, so the
// cache's reads dominate: each position's keys and values are read once per query head.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops/attention.cuh"
#include "backend/cuda/ops/attention_decode.cuh"
#include "backend/cuda/ops/common.cuh"

namespace layup::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kChannelsPerLane = kMaxAttentionHeadDim / 32;

template <class T>
__global__ void append_kv_kernel(T* k_cache, T* v_cache, const T* qkv, int T_, int first, int Hq,
                                 int Hkv, int D) {
  const int kv_width = Hkv * D, qkv_width = (Hq + 2 * Hkv) * D;
  const size_t count = static_cast<size_t>(T_) * kv_width;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t t = i / kv_width, c = i % kv_width;
    const T* row = qkv + t * qkv_width;
    k_cache[(first + t) * kv_width + c] = row[Hq * D + c];
    v_cache[(first + t) * kv_width + c] = row[(Hq + Hkv) * D + c];
  }
}

template <class T>
__global__ void attention_decode_kernel(T* out, const T* k_cache, const T* v_cache, const T* qkv,
                                        int first, int Hq, int Hkv, int D, float scale) {
  const int h = blockIdx.x, t = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kv_width = Hkv * D, kv_offset = (h / (Hq / Hkv)) * D;
  const int positions = first + t + 1;
  const T* q_row = qkv + static_cast<size_t>(t) * (Hq + 2 * Hkv) * D + static_cast<size_t>(h) * D;
  float q[kChannelsPerLane], o[kChannelsPerLane];
#pragma unroll
  for (int i = 0; i < kChannelsPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < D ? to_float(q_row[d]) : 0.0f;
    o[i] = 0.0f;
  }
  float m = -INFINITY, s = 0.0f;
  for (int u = warp; u < positions; u += kWarps) {
    const T* k = k_cache + static_cast<size_t>(u) * kv_width + kv_offset;
    const T* v = v_cache + static_cast<size_t>(u) * kv_width + kv_offset;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kChannelsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) dot += q[i] * to_float(k[d]);
    }
    const float x = scale * warp_sum(dot);
    const float m_new = fmaxf(m, x);
    const float correction = expf(m - m_new);  // 0 while m is -inf
    const float p = expf(x - m_new);
    s = s * correction + p;
#pragma unroll
    for (int i = 0; i < kChannelsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < D) o[i] = o[i] * correction + p * to_float(v[d]);
    }
    m = m_new;
  }

  __shared__ float warp_m[kWarps], warp_s[kWarps];
  __shared__ float warp_o[kWarps][kMaxAttentionHeadDim];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
#pragma unroll
  for (int i = 0; i < kChannelsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < D) warp_o[warp][d] = o[i];
  }
  __syncthreads();
  float max_m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) max_m = fmaxf(max_m, warp_m[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (warp_s[w] > 0.0f) total += warp_s[w] * expf(warp_m[w] - max_m);
  T* out_row = out + static_cast<size_t>(t) * Hq * D + static_cast<size_t>(h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (warp_s[w] > 0.0f) sum += warp_o[w][d] * expf(warp_m[w] - max_m);
    out_row[d] = from_float<T>(sum / total);
  }
}

}  // namespace

template <class T>
void attention_decode_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int T_, int first,
                              int Hq, int Hkv, int D, cudaStream_t stream) {
  constexpr int kThreads = 256;
  append_kv_kernel<<<grid_for(static_cast<size_t>(T_) * Hkv * D, kThreads), kThreads, 0, stream>>>(
      k_cache, v_cache, qkv, T_, first, Hq, Hkv, D);
  LAYUP_CUDA_CHECK_LAUNCH();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  attention_decode_kernel<<<dim3(Hq, T_), 32 * kWarps, 0, stream>>>(out, k_cache, v_cache, qkv,
                                                                    first, Hq, Hkv, D, scale);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template void attention_decode_forward<float>(float*, float*, float*, const float*, int, int, int,
                                              int, int, cudaStream_t);
template void attention_decode_forward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*,
                                                      __nv_bfloat16*, const __nv_bfloat16*, int,
                                                      int, int, int, int, cudaStream_t);

}  // namespace layup::cuda
