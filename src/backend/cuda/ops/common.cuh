// Device-side helpers shared by the CUDA ops: conversions between the activation types and fp32,
// 16-byte packs for vectorized loads, warp reductions, and the deterministic column reduction
// that every "sum over rows into a weight gradient" uses.
//
// Activations are float or __nv_bfloat16; every op converts to fp32 on load, computes and
// accumulates in fp32, and rounds once on store.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops/scratch_floats.h"
#include "backend/cuda/ops/weight_gradient.cuh"

namespace layup::cuda {

inline int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}
inline size_t ceil_div(size_t a, size_t b) {
  return (a + b - 1) / b;
}

__host__ __device__ inline float to_float(float x) {
  return x;
}
__host__ __device__ inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) {
  return x;
}
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);  // round to nearest even
}

// 16 bytes of T: one vectorized load or store (4 floats or 8 bf16).
template <class T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <class T>
__device__ inline Pack<T> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T>*>(p);
}
template <class T>
__device__ inline void store_pack(T* p, const Pack<T>& pack) {
  *reinterpret_cast<Pack<T>*>(p) = pack;
}

__host__ __device__ inline bool is_aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Grid size for grid-stride loops over `count` items with `threads` per block.
inline int grid_for(size_t count, int threads) {
  const size_t blocks = ceil_div(std::max<size_t>(count, 1), static_cast<size_t>(threads));
  return static_cast<int>(std::min<size_t>(blocks, size_t{1} << 20));
}

// K consecutive elements as floats: one 16-byte pack (K == Pack<T>::kSize) or one scalar.
template <int K, class T>
__device__ inline void load_floats(const T* p, float (&values)[K]) {
  if constexpr (K == 1) {
    values[0] = to_float(*p);
  } else {
    static_assert(K == Pack<T>::kSize, "a vector access is one 16-byte pack");
    const Pack<T> pack = load_pack(p);
#pragma unroll
    for (int i = 0; i < K; ++i) values[i] = to_float(pack.v[i]);
  }
}
template <int K, class T>
__device__ inline void store_floats(T* p, const float (&values)[K]) {
  if constexpr (K == 1) {
    *p = from_float<T>(values[0]);
  } else {
    static_assert(K == Pack<T>::kSize, "a vector access is one 16-byte pack");
    Pack<T> pack;
#pragma unroll
    for (int i = 0; i < K; ++i) pack.v[i] = from_float<T>(values[i]);
    store_pack(p, pack);
  }
}

// ---- Elementwise ops --------------------------------------------------------------------------
//
// Op::apply<K>(i) handles elements [i, i + K). The body runs with K = one 16-byte pack when every
// pointer is 16-byte aligned; the rest (or everything, when not aligned) runs with K = 1.

template <int K, class Op>
__global__ void elementwise_kernel(size_t begin, size_t end, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x * K;
  for (size_t i = begin + (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) * K; i < end;
       i += stride)
    op.template apply<K>(i);
}

template <int kPackSize, class Op>
void launch_elementwise(size_t count, bool aligned, const Op& op, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t body = aligned ? count / kPackSize * kPackSize : 0;
  if (body > 0) {
    elementwise_kernel<kPackSize>
        <<<grid_for(body / kPackSize, kThreads), kThreads, 0, stream>>>(0, body, op);
    LAYUP_CUDA_CHECK_LAUNCH();
  }
  if (body < count) {
    elementwise_kernel<1>
        <<<grid_for(count - body, kThreads), kThreads, 0, stream>>>(body, count, op);
    LAYUP_CUDA_CHECK_LAUNCH();
  }
}

// ---- Deterministic column sums ----------------------------------------------------------------
//
// Weight gradients of biases and layer norms are sums over the N rows of an [N, C] matrix. Atomic
// float adds would make them depend on timing; instead the rows are cut into a fixed number of
// chunks (a function of N alone, never of the GPU), each (chunk, 32 columns) block sums its rows
// in a fixed order into a partial, and a second kernel adds the partials of each column in a fixed
// grouping and adds the total to the output or stores it (WeightGradient). The result is bitwise
// reproducible.
//
// Where the row width is a multiple of a 16-byte pack and the inputs are aligned (every GPT-2
// width), each thread owns K = one pack of adjacent columns, so a warp reads 512 contiguous bytes
// of a row per load instead of 64. The grouping of rows, and so the result, does not depend on K.

constexpr int kColumnTile = 32;  // threads per block along the columns: one warp
constexpr int kColumnLanes = 8;  // rows summed side by side in a block
// kMaxRowChunks, column_reduce_chunks and column_reduce_scratch_floats: scratch_floats.h.

// term.template at<K>(n, c, values) writes the kOutputs values row n contributes to each of the K
// columns c .. c+K-1 (values[k][i] for column c+i); with K > 1, c is a multiple of K.
template <int kOutputs, int K, class Term>
__global__ void __launch_bounds__(kColumnTile* kColumnLanes)
    column_partial_sums_kernel(float* partials, int N, int C, int rows_per_chunk, Term term) {
  __shared__ float lanes[kOutputs][kColumnLanes][kColumnTile * K];
  const int c = (blockIdx.x * kColumnTile + threadIdx.x) * K;
  const int chunk = blockIdx.y;
  const int row_end = min(N, (chunk + 1) * rows_per_chunk);
  float sum[kOutputs][K] = {};
  if (c < C) {
    for (int n = chunk * rows_per_chunk + threadIdx.y; n < row_end; n += kColumnLanes) {
      float values[kOutputs][K];
      term.template at<K>(n, c, values);
#pragma unroll
      for (int k = 0; k < kOutputs; ++k)
#pragma unroll
        for (int i = 0; i < K; ++i) sum[k][i] += values[k][i];
    }
  }
#pragma unroll
  for (int k = 0; k < kOutputs; ++k)
#pragma unroll
    for (int i = 0; i < K; ++i) lanes[k][threadIdx.y][threadIdx.x * K + i] = sum[k][i];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < kOutputs; ++k)
#pragma unroll
      for (int i = 0; i < K; ++i) {
        float total = 0.0f;
        for (int lane = 0; lane < kColumnLanes; ++lane)
          total += lanes[k][lane][threadIdx.x * K + i];
        partials[(static_cast<size_t>(k) * gridDim.y + chunk) * C + c + i] = total;
      }
  }
}

template <int kOutputs>
struct ColumnOutputs {
  float* out[kOutputs];
};

// The finishing pass: each block owns kColumnTile columns, and its kFinishGroups rows of threads
// each add a fixed run of chunks in chunk order; the first row then adds the runs' sums in run
// order. One thread adding all (up to kMaxRowChunks) chunks of a column in a row made every launch
// a chain of dependent loads (9.4 us each at gpt2-medium, 145 launches a step); split in runs, a
// thread's loads are few and all in flight. The grouping depends on the chunk count alone, so the
// result is still the same bits on every GPU and every run.
constexpr int kFinishGroups = 8;

template <int kOutputs>
__global__ void __launch_bounds__(kColumnTile* kFinishGroups)
    column_finish_kernel(ColumnOutputs<kOutputs> outputs, const float* partials, int chunks,
                         int run_length, int C, bool accumulate) {
  __shared__ float run_sums[kOutputs][kFinishGroups][kColumnTile];
  const int c = blockIdx.x * kColumnTile + threadIdx.x;
  const int first = threadIdx.y * run_length;
  const int last = min(chunks, first + run_length);
#pragma unroll
  for (int k = 0; k < kOutputs; ++k) {
    float sum = 0.0f;
    if (c < C) {
#pragma unroll 16
      for (int chunk = first; chunk < last; ++chunk)
        sum += partials[(static_cast<size_t>(k) * chunks + chunk) * C + c];
    }
    run_sums[k][threadIdx.y][threadIdx.x] = sum;
  }
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
#pragma unroll
  for (int k = 0; k < kOutputs; ++k) {
    float total = 0.0f;
#pragma unroll
    for (int run = 0; run < kFinishGroups; ++run) total += run_sums[k][run][threadIdx.x];
    outputs.out[k][c] = accumulate ? outputs.out[k][c] + total : total;
  }
}

// outputs.out[k][c] (+)= sum over n of term(n, c)[k], as `mode` says; scratch holds
// column_reduce_scratch_floats(N, C, kOutputs) floats. `packed` (the caller's promise that C is a
// multiple of kPack and the term's inputs are 16-byte aligned) selects kPack columns per thread.
template <int kOutputs, int kPack, class Term>
void column_sums(ColumnOutputs<kOutputs> outputs, int N, int C, Term term, bool packed,
                 WeightGradient mode, float* scratch, cudaStream_t stream) {
  const int chunks = column_reduce_chunks(N);
  const int rows_per_chunk = ceil_div(N, chunks);
  if (packed && C % kPack == 0) {
    const dim3 grid(ceil_div(C / kPack, kColumnTile), chunks);
    column_partial_sums_kernel<kOutputs, kPack>
        <<<grid, dim3(kColumnTile, kColumnLanes), 0, stream>>>(scratch, N, C, rows_per_chunk, term);
  } else {
    const dim3 grid(ceil_div(C, kColumnTile), chunks);
    column_partial_sums_kernel<kOutputs, 1>
        <<<grid, dim3(kColumnTile, kColumnLanes), 0, stream>>>(scratch, N, C, rows_per_chunk, term);
  }
  LAYUP_CUDA_CHECK_LAUNCH();
  column_finish_kernel<kOutputs>
      <<<ceil_div(C, kColumnTile), dim3(kColumnTile, kFinishGroups), 0, stream>>>(
          outputs, scratch, chunks, ceil_div(chunks, kFinishGroups), C,
          mode == WeightGradient::kAccumulate);
  LAYUP_CUDA_CHECK_LAUNCH();
}

}  // namespace layup::cuda
