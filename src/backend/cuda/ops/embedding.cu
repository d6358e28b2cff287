// Token + position embedding (token alone where there is no position table), forward and backward.
//
// Forward: one thread per (position, 16-byte pack of channels) where C and the buffers allow it.
// Backward: one block per distinct token (its positions come from the host-built plan) and one
// block per position t for dwpe; threads stride over the channels, so every read of a dout row is
// coalesced, and each output element is written by exactly one thread, once.
#include <cuda_bf16.h>

#include <algorithm>
#include <numeric>

#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/embedding.cuh"

namespace layup::cuda {
namespace {

constexpr int kThreads = 256;

template <int K, class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int BT, int T_, int C) {
  const int groups_per_row = C / K;
  const size_t total = static_cast<size_t>(BT) * groups_per_row;
  for (size_t g = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; g < total;
       g += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int position = static_cast<int>(g / groups_per_row);
    const int c = static_cast<int>(g % groups_per_row) * K;
    const int t = position % T_;
    float token_part[K], position_part[K];
    load_floats<K>(wte + static_cast<size_t>(tokens[position]) * C + c, token_part);
    if (wpe) {  // the Llama family has no position table (rotary positions instead)
      load_floats<K>(wpe + static_cast<size_t>(t) * C + c, position_part);
#pragma unroll
      for (int i = 0; i < K; ++i) token_part[i] += position_part[i];
    }
    store_floats<K>(out + static_cast<size_t>(position) * C + c, token_part);
  }
}

template <class T>
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const T* dout,
                                          const int32_t* positions, const int32_t* segment_start,
                                          const int32_t* segment_token, int segments, int B, int T_,
                                          int C) {
  if (static_cast<int>(blockIdx.x) < segments) {
    // One token: sum its positions' rows in plan order.
    const int begin = segment_start[blockIdx.x], end = segment_start[blockIdx.x + 1];
    float* row = dwte + static_cast<size_t>(segment_token[blockIdx.x]) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float sum = 0.0f;
      for (int i = begin; i < end; ++i)
        sum += to_float(dout[static_cast<size_t>(positions[i]) * C + c]);
      row[c] += sum;
    }
  } else {
    // One position t: sum over the batch in order b = 0..B-1.
    const int t = blockIdx.x - segments;
    float* row = dwpe + static_cast<size_t>(t) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float sum = 0.0f;
      for (int b = 0; b < B; ++b) sum += to_float(dout[(static_cast<size_t>(b) * T_ + t) * C + c]);
      row[c] += sum;
    }
  }
}

}  // namespace

EmbeddingBackwardPlan make_embedding_backward_plan(const int32_t* tokens, int count) {
  EmbeddingBackwardPlan plan;
  plan.positions.resize(count);
  std::iota(plan.positions.begin(), plan.positions.end(), 0);
  std::stable_sort(plan.positions.begin(), plan.positions.end(),
                   [tokens](int32_t a, int32_t b) { return tokens[a] < tokens[b]; });
  for (int i = 0; i < count; ++i) {
    const int32_t token = tokens[plan.positions[i]];
    if (i == 0 || token != plan.segment_token.back()) {
      plan.segment_start.push_back(i);
      plan.segment_token.push_back(token);
    }
  }
  plan.segment_start.push_back(count);
  return plan;
}

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                       int C, cudaStream_t stream) {
  const int BT = B * T_;
  constexpr int kPackSize = Pack<T>::kSize;
  if (C % kPackSize == 0 && is_aligned16(out) && is_aligned16(wte) && is_aligned16(wpe)) {
    const size_t work = static_cast<size_t>(BT) * (C / kPackSize);
    embedding_forward_kernel<kPackSize>
        <<<grid_for(work, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, BT, T_, C);
  } else {
    embedding_forward_kernel<1>
        <<<grid_for(static_cast<size_t>(BT) * C, kThreads), kThreads, 0, stream>>>(out, tokens, wte,
                                                                                   wpe, BT, T_, C);
  }
  LAYUP_CUDA_CHECK_LAUNCH();
}

template <class T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* positions,
                        const int32_t* segment_start, const int32_t* segment_token, int segments,
                        int B, int T_, int C, cudaStream_t stream) {
  const int threads = std::min(kThreads, ceil_div(C, 32) * 32);
  const int position_blocks = dwpe ? T_ : 0;
  embedding_backward_kernel<<<segments + position_blocks, threads, 0, stream>>>(
      dwte, dwpe, dout, positions, segment_start, segment_token, segments, B, T_, C);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int, int,
                                       int, cudaStream_t);
template void embedding_forward<__nv_bfloat16>(__nv_bfloat16*, const int32_t*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, int, int, int, cudaStream_t);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*,
                                        const int32_t*, const int32_t*, int, int, int, int,
                                        cudaStream_t);
template void embedding_backward<__nv_bfloat16>(float*, float*, const __nv_bfloat16*,
                                                const int32_t*, const int32_t*, const int32_t*, int,
                                                int, int, int, cudaStream_t);

}  // namespace layup::cuda
