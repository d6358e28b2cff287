// Softmax cross-entropy, forward and backward.
//
// For one row with logits z over the real vocabulary and target y:
//
//   lse  = log sum_v exp(z_v)          loss = lse - z_y
//   dloss/dz_v = softmax(z)_v - [v == y] = exp(z_v - lse) - [v == y]
//
// One block per row. The forward reads the row once with an online log-sum-exp: each thread keeps
// a running max m and a sum s of exp(z - m), rescaling s only when the max grows (so almost every
// element costs one exp); the block then merges the (m, s) pairs. The forward saves lse, so the
// backward is one more read-and-write pass. Together they move the same bytes as a single fused
// kernel would (that one too must read each row twice: once for lse, once to write dlogits), and
// splitting them keeps the logits intact until the backward, as ModelBackend::logits() promises.
// A row whose target is below 0 is not learned: the forward skips it (loss 0), the backward writes
// it as zeros, as the CPU op does.
#include <cuda_bf16.h>

#include "backend/cuda/ops/classifier.cuh"
#include "backend/cuda/ops/common.cuh"

namespace layup::cuda {
namespace {

constexpr int kThreads = 512;

struct MaxSum {
  float max = -INFINITY;
  float sum = 0.0f;  // of exp(z - max)
};

__device__ inline void add_logit(MaxSum& acc, float z) {
  if (z > acc.max) {
    acc.sum = acc.sum * expf(acc.max - z) + 1.0f;  // expf(-inf) = 0 on the first element
    acc.max = z;
  } else {
    acc.sum += expf(z - acc.max);
  }
}

__device__ inline MaxSum merge(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float max = fmaxf(a.max, b.max);
  return MaxSum{max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    classifier_forward_kernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                              int V, int Vp) {
  const int n = blockIdx.x;
  if (targets[n] < 0) {  // the same for the whole block, so no thread waits at a barrier below
    if (threadIdx.x == 0) {
      lse[n] = 0.0f;
      losses[n] = 0.0f;
    }
    return;
  }
  const T* z = logits + static_cast<size_t>(n) * Vp;
  constexpr int K = Pack<T>::kSize;

  MaxSum acc;
  // 16-byte loads over the aligned body of the row, then the scalar rest.
  const int vector_end = is_aligned16(z) ? V / K * K : 0;
  for (int v = threadIdx.x * K; v < vector_end; v += blockDim.x * K) {
    float values[K];
    load_floats<K>(z + v, values);
    // One rescale per pack, not per element: the pack's max first, then K exps against it.
    float pack_max = values[0];
#pragma unroll
    for (int i = 1; i < K; ++i) pack_max = fmaxf(pack_max, values[i]);
    float pack_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < K; ++i) pack_sum += expf(values[i] - pack_max);
    acc = merge(acc, MaxSum{pack_max, pack_sum});
  }
  for (int v = vector_end + threadIdx.x; v < V; v += blockDim.x) add_logit(acc, to_float(z[v]));

  // Merge across the warp, then across warps, in a fixed order.
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, offset),
                 __shfl_xor_sync(0xffffffffu, acc.sum, offset)};
    acc = merge(acc, other);
  }
  __shared__ MaxSum warp_results[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
      total = merge(total, warp_results[w]);
    const float row_lse = total.max + logf(total.sum);
    lse[n] = row_lse;
    losses[n] = row_lse - to_float(z[targets[n]]);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    classifier_backward_kernel(T* dlogits, const T* logits, const float* lse,
                               const int32_t* targets, int V, int Vp, float dloss) {
  const int n = blockIdx.x;
  const T* z = logits + static_cast<size_t>(n) * Vp;
  T* dz = dlogits + static_cast<size_t>(n) * Vp;
  const float row_lse = lse[n];
  const int target = targets[n];
  constexpr int K = Pack<T>::kSize;

  auto gradient = [&](int v, float logit) {
    if (v >= V || target < 0) return 0.0f;
    const float probability = expf(logit - row_lse);
    return (probability - (v == target ? 1.0f : 0.0f)) * dloss;
  };
  // Padded columns included: they get exactly 0.
  const int vector_end = is_aligned16(z) && is_aligned16(dz) ? Vp / K * K : 0;
  for (int v = threadIdx.x * K; v < vector_end; v += blockDim.x * K) {
    float values[K];
    load_floats<K>(z + v, values);
#pragma unroll
    for (int i = 0; i < K; ++i) values[i] = gradient(v + i, values[i]);
    store_floats<K>(dz + v, values);
  }
  for (int v = vector_end + threadIdx.x; v < Vp; v += blockDim.x)
    dz[v] = from_float<T>(gradient(v, v < V ? to_float(z[v]) : 0.0f));
}

}  // namespace

template <class T>
void classifier_forward(float* losses, float* lse, const T* logits, const int32_t* targets, int N,
                        int V, int Vp, cudaStream_t stream) {
  classifier_forward_kernel<<<N, kThreads, 0, stream>>>(losses, lse, logits, targets, V, Vp);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template <class T>
void classifier_backward(T* dlogits, const T* logits, const float* lse, const int32_t* targets,
                         int N, int V, int Vp, float dloss, cudaStream_t stream) {
  classifier_backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, V, Vp,
                                                         dloss);
  LAYUP_CUDA_CHECK_LAUNCH();
}

template void classifier_forward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                        cudaStream_t);
template void classifier_forward<__nv_bfloat16>(float*, float*, const __nv_bfloat16*,
                                                const int32_t*, int, int, int, cudaStream_t);
template void classifier_backward<float>(float*, const float*, const float*, const int32_t*, int,
                                         int, int, float, cudaStream_t);
template void classifier_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                 const int32_t*, int, int, int, float,
                                                 cudaStream_t);

}  // namespace layup::cuda
