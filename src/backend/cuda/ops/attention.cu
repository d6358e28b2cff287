// Causal self-attention, forward and backward, flash-attention style (Dao et al., FlashAttention
// and FlashAttention-2), on the CUDA cores in fp32.
//
// For one batch row and head (dropping b, h), with Q, K, V the [T, hd] slices of qkv and
// scale = 1/sqrt(hd):
//
//   S = scale Q K^T,  P = softmax over each row of S restricted to u <= t,  O = P V
//
// Forward. The T x T matrices are never stored. A block owns 32 query rows and walks the key tiles
// up to the diagonal; for each row it keeps a running max m, a running sum l of exp(S - m) and an
// unnormalized output o. When a tile raises the max from m to m', the old l and o are rescaled by
// exp(m - m'). At the end O = o / l and the row's log-sum-exp lse = m + log l is saved.
//
// Backward. With lse saved, P[t,u] = exp(S[t,u] - lse[t]) is recomputed exactly, tile by tile:
//
//   dV = P^T dO      dP = dO V^T      dS = P o (dP - D),  D[t] = sum_u P[t,u] dP[t,u] = dO[t] .
//   O[t] dQ = scale dS K  dK = scale dS^T Q
//
// D comes first from one small kernel. Then two kernels recompute P: one owns 32 key rows and
// walks the query tiles at or below the diagonal (accumulating dK and dV in registers), the other
// owns 32 query rows and walks the key tiles (accumulating dQ). Computing P twice costs some
// arithmetic but no atomics: every element of dqkv is summed by one thread in a fixed order, so the
// result is deterministic.
//
// Thread layout (all kernels): 256 threads on a 32 x 32 tile; thread i owns row i / 8 of the tile,
// the 4 tile columns (i % 8) + 8j for the scores, and the hd/8 channels (i % 8) + 8j of its row's
// accumulators. A row's 8 threads are consecutive lanes of one warp, so row reductions are three
// shuffles and the per-row probabilities pass between phases through shared memory with only a
// __syncwarp. Tiles are stored in fp32 with rows padded to HD + 1 floats, which puts the 8 rows a
// warp reads at once in 8 different banks.
//
// This is the correct-first version: fp32 FMAs on the CUDA cores, shared-memory bound. The fast
// path (bf16 tensor-core MMA, wgmma on Hopper) is a later step; these kernels stay as its
// reference and as the fp32 path.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/ops/attention.cuh"
#include "backend/cuda/ops/common.cuh"

namespace layup::cuda {
namespace {

constexpr int kTile = 32;      // query rows per block, and key rows per step
constexpr int kThreads = 256;  // 8 threads per tile row
constexpr int kRowThreads = 8;
constexpr int kColumnsPerThread = kTile / kRowThreads;  // 4
constexpr int kPStride = kTile + 8;  // row stride of the probability tiles: 4 rows x 8 lanes hit
                                     // 32 different banks

template <int HD>
struct TileShape {
  static constexpr int kStride = HD + 1;              // floats per stored row
  static constexpr int kChannels = HD / kRowThreads;  // accumulator channels per thread
  static constexpr int kFloats = kTile * kStride;
  static_assert(HD % 32 == 0, "the padded head dimension is a multiple of 32");
};

__device__ inline int tile_count(int T_) {
  return (T_ + kTile - 1) / kTile;
}

// Rows [first, first + kTile) of one head's [T, hd] slice (rows `stride` elements apart) into an
// fp32 tile; rows at or beyond T and channels at or beyond hd are zero.
template <int HD, class T>
__device__ void load_tile(float* tile, const T* src, int first, int T_, size_t stride, int hd) {
  for (int i = threadIdx.x; i < kTile * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float value = 0.0f;
    if (first + r < T_ && d < hd)
      value = to_float(src[static_cast<size_t>(first + r) * stride + d]);
    tile[r * TileShape<HD>::kStride + d] = value;
  }
}

// Sum over the 8 threads of one tile row (consecutive lanes).
__device__ inline float row_sum(float x) {
  for (int offset = kRowThreads / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ inline float row_max(float x) {
  for (int offset = kRowThreads / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// out[j] = a_row . b_tile[sub + 8j] for the thread's 4 columns.
template <int HD>
__device__ inline void row_dots(const float* a_row, const float* b_tile, int sub,
                                float (&out)[kColumnsPerThread]) {
  constexpr int S = TileShape<HD>::kStride;
#pragma unroll
  for (int j = 0; j < kColumnsPerThread; ++j) out[j] = 0.0f;
#pragma unroll 16
  for (int d = 0; d < HD; ++d) {
    const float a = a_row[d];
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j)
      out[j] += a * b_tile[(sub + kRowThreads * j) * S + d];
  }
}

template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH, int hd,
                             float scale) {
  using Shape = TileShape<HD>;
  constexpr int S = Shape::kStride;
  extern __shared__ float shared[];
  float* q_tile = shared;
  float* k_tile = q_tile + Shape::kFloats;
  float* v_tile = k_tile + Shape::kFloats;
  float* p_tile = v_tile + Shape::kFloats;  // [kTile][kPStride]

  const int q_block = tile_count(T_) - 1 - blockIdx.x;  // the longest rows start first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const size_t qkv_stride = 3 * static_cast<size_t>(C);
  const T* head = qkv + static_cast<size_t>(b) * T_ * qkv_stride + h * hd;
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int q0 = q_block * kTile, q = q0 + row;

  load_tile<HD>(q_tile, head, q0, T_, qkv_stride, hd);
  float o[Shape::kChannels] = {};
  float m = -INFINITY, l = 0.0f;
  for (int k_block = 0; k_block <= q_block; ++k_block) {
    const int k0 = k_block * kTile;
    __syncthreads();  // the previous step's readers are done with k_tile, v_tile and p_tile
    load_tile<HD>(k_tile, head + C, k0, T_, qkv_stride, hd);
    load_tile<HD>(v_tile, head + 2 * C, k0, T_, qkv_stride, hd);
    __syncthreads();

    float s[kColumnsPerThread];
    row_dots<HD>(q_tile + row * S, k_tile, sub, s);
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int key = k0 + sub + kRowThreads * j;
      s[j] = (key <= q && key < T_) ? s[j] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    // Key k0 is visible to every row of this tile (k0 <= q0 <= q), so the new max is finite and
    // the first rescale is exp(-inf) = 0.
    const float m_new = fmaxf(m, row_max(tile_max));
    const float alpha = expf(m - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const float p = expf(s[j] - m_new);
      sum += p;
      p_tile[row * kPStride + sub + kRowThreads * j] = p;
    }
    l = l * alpha + row_sum(sum);
    m = m_new;
    __syncwarp();  // the row's probabilities, written by its 8 lanes, are read by all of them

#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) o[i] *= alpha;
    for (int c = 0; c < kTile; ++c) {
      const float p = p_tile[row * kPStride + c];
#pragma unroll
      for (int i = 0; i < Shape::kChannels; ++i) o[i] += p * v_tile[c * S + sub + kRowThreads * i];
    }
  }

  if (q < T_) {
    const float inv_l = 1.0f / l;
    T* out_row = out + (static_cast<size_t>(b) * T_ + q) * C + h * hd;
#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) {
      const int d = sub + kRowThreads * i;
      if (d < hd) out_row[d] = from_float<T>(o[i] * inv_l);
    }
    if (sub == 0) lse[static_cast<size_t>(blockIdx.y) * T_ + q] = m + logf(l);
  }
}

// delta[b,h,t] = dout[b,t,head h] . out[b,t,head h]: one warp per (b, t, h).
template <class T>
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int B, int T_,
                                       int C, int NH, int hd) {
  const size_t warp = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= static_cast<size_t>(B) * T_ * NH) return;
  const int h = static_cast<int>(warp % NH);
  const size_t bt = warp / NH;
  const size_t base = bt * C + h * hd;
  float sum = 0.0f;
  for (int d = lane; d < hd; d += 32) sum += to_float(dout[base + d]) * to_float(out[base + d]);
  sum = warp_sum(sum);
  const size_t b = bt / T_, t = bt % T_;
  if (lane == 0) delta[(b * NH + h) * T_ + t] = sum;
}

// dK and dV of 32 key rows, walking the query tiles from the diagonal down.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                 const float* delta, int T_, int C, int NH, int hd, float scale) {
  using Shape = TileShape<HD>;
  constexpr int S = Shape::kStride;
  extern __shared__ float shared[];
  float* k_tile = shared;
  float* v_tile = k_tile + Shape::kFloats;
  float* q_tile = v_tile + Shape::kFloats;
  float* do_tile = q_tile + Shape::kFloats;
  float* p_tile = do_tile + Shape::kFloats;    // P^T: [key row][query column]
  float* ds_tile = p_tile + kTile * kPStride;  // dS^T
  float* lse_tile = ds_tile + kTile * kPStride;
  float* delta_tile = lse_tile + kTile;

  const int tiles = tile_count(T_);
  const int k_block = blockIdx.x;  // block 0 has the most query tiles and starts first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const size_t qkv_stride = 3 * static_cast<size_t>(C);
  const T* head = qkv + static_cast<size_t>(b) * T_ * qkv_stride + h * hd;
  const T* dout_head = dout + static_cast<size_t>(b) * T_ * C + h * hd;
  const float* lse_row = lse + static_cast<size_t>(blockIdx.y) * T_;
  const float* delta_row = delta + static_cast<size_t>(blockIdx.y) * T_;
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int k0 = k_block * kTile, key = k0 + row;

  load_tile<HD>(k_tile, head + C, k0, T_, qkv_stride, hd);
  load_tile<HD>(v_tile, head + 2 * C, k0, T_, qkv_stride, hd);
  float dk[Shape::kChannels] = {}, dv[Shape::kChannels] = {};
  for (int q_block = k_block; q_block < tiles; ++q_block) {
    const int q0 = q_block * kTile;
    __syncthreads();  // the previous step's readers are done with the query-side tiles
    load_tile<HD>(q_tile, head, q0, T_, qkv_stride, hd);
    load_tile<HD>(do_tile, dout_head, q0, T_, C, hd);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const bool inside = q0 + i < T_;
      lse_tile[i] = inside ? lse_row[q0 + i] : 0.0f;
      delta_tile[i] = inside ? delta_row[q0 + i] : 0.0f;
    }
    __syncthreads();

    float s[kColumnsPerThread], dp[kColumnsPerThread];
    row_dots<HD>(k_tile + row * S, q_tile, sub, s);
    row_dots<HD>(v_tile + row * S, do_tile, sub, dp);
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int c = sub + kRowThreads * j, query = q0 + c;
      const bool visible = key <= query && query < T_ && key < T_;
      const float p = visible ? expf(s[j] * scale - lse_tile[c]) : 0.0f;
      p_tile[row * kPStride + c] = p;
      ds_tile[row * kPStride + c] = p * (dp[j] - delta_tile[c]);
    }
    __syncwarp();

    for (int c = 0; c < kTile; ++c) {
      const float p = p_tile[row * kPStride + c], ds = ds_tile[row * kPStride + c];
#pragma unroll
      for (int i = 0; i < Shape::kChannels; ++i) {
        const int d = sub + kRowThreads * i;
        dv[i] += p * do_tile[c * S + d];
        dk[i] += ds * q_tile[c * S + d];
      }
    }
  }

  if (key < T_) {
    T* dk_row = dqkv + (static_cast<size_t>(b) * T_ + key) * qkv_stride + C + h * hd;
    T* dv_row = dk_row + C;
#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) {
      const int d = sub + kRowThreads * i;
      if (d < hd) {
        dk_row[d] = from_float<T>(to_float(dk_row[d]) + scale * dk[i]);
        dv_row[d] = from_float<T>(to_float(dv_row[d]) + dv[i]);
      }
    }
  }
}

// dQ of 32 query rows, walking the key tiles up to the diagonal.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                const float* delta, int T_, int C, int NH, int hd, float scale) {
  using Shape = TileShape<HD>;
  constexpr int S = Shape::kStride;
  extern __shared__ float shared[];
  float* q_tile = shared;
  float* do_tile = q_tile + Shape::kFloats;
  float* k_tile = do_tile + Shape::kFloats;
  float* v_tile = k_tile + Shape::kFloats;
  float* ds_tile = v_tile + Shape::kFloats;  // [query row][key column]

  const int q_block = tile_count(T_) - 1 - blockIdx.x;  // the longest rows start first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const size_t qkv_stride = 3 * static_cast<size_t>(C);
  const T* head = qkv + static_cast<size_t>(b) * T_ * qkv_stride + h * hd;
  const T* dout_head = dout + static_cast<size_t>(b) * T_ * C + h * hd;
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int q0 = q_block * kTile, q = q0 + row;
  const float row_lse = q < T_ ? lse[static_cast<size_t>(blockIdx.y) * T_ + q] : 0.0f;
  const float row_delta = q < T_ ? delta[static_cast<size_t>(blockIdx.y) * T_ + q] : 0.0f;

  load_tile<HD>(q_tile, head, q0, T_, qkv_stride, hd);
  load_tile<HD>(do_tile, dout_head, q0, T_, C, hd);
  float dq[Shape::kChannels] = {};
  for (int k_block = 0; k_block <= q_block; ++k_block) {
    const int k0 = k_block * kTile;
    __syncthreads();  // the previous step's readers are done with k_tile, v_tile and ds_tile
    load_tile<HD>(k_tile, head + C, k0, T_, qkv_stride, hd);
    load_tile<HD>(v_tile, head + 2 * C, k0, T_, qkv_stride, hd);
    __syncthreads();

    float s[kColumnsPerThread], dp[kColumnsPerThread];
    row_dots<HD>(q_tile + row * S, k_tile, sub, s);
    row_dots<HD>(do_tile + row * S, v_tile, sub, dp);
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int c = sub + kRowThreads * j, key = k0 + c;
      const bool visible = key <= q && q < T_ && key < T_;
      const float p = visible ? expf(s[j] * scale - row_lse) : 0.0f;
      ds_tile[row * kPStride + c] = p * (dp[j] - row_delta);
    }
    __syncwarp();

    for (int c = 0; c < kTile; ++c) {
      const float ds = ds_tile[row * kPStride + c];
#pragma unroll
      for (int i = 0; i < Shape::kChannels; ++i)
        dq[i] += ds * k_tile[c * S + sub + kRowThreads * i];
    }
  }

  if (q < T_) {
    T* dq_row = dqkv + (static_cast<size_t>(b) * T_ + q) * qkv_stride + h * hd;
#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) {
      const int d = sub + kRowThreads * i;
      if (d < hd) dq_row[d] = from_float<T>(to_float(dq_row[d]) + scale * dq[i]);
    }
  }
}

// Dynamic shared memory beyond the default 48 KB must be opted into, once per kernel (the kernel is
// a template argument so that each one gets its own flag).
template <auto kKernel, class... Args>
void launch_with_shared(dim3 grid, size_t shared_bytes, cudaStream_t stream, Args... args) {
  static const bool opted_in = [shared_bytes] {
    if (shared_bytes > 48 * 1024) {
      LAYUP_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes)));
    }
    return true;
  }();
  (void)opted_in;
  kKernel<<<grid, kThreads, shared_bytes, stream>>>(args...);
  LAYUP_CUDA_CHECK_LAUNCH();
}

void check_shape(int B, int T_, int C, int NH) {
  LAYUP_CHECK(NH >= 1 && C % NH == 0, "attention: width ", C, " is not divisible by ", NH,
              " heads");
  LAYUP_CHECK(C / NH <= kMaxAttentionHeadDim, "attention: head dimension ", C / NH, " exceeds the ",
              kMaxAttentionHeadDim, " the CUDA kernels support");
  LAYUP_CHECK(static_cast<long long>(B) * NH <= 65535,
              "attention: B * heads = ", static_cast<long long>(B) * NH,
              " exceeds the 65535 blocks of one grid dimension");
  LAYUP_CHECK(T_ >= 1, "attention: empty sequence");
}

template <class T, int HD>
void attention_forward_for(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH,
                           cudaStream_t stream) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t shared_bytes = (3 * TileShape<HD>::kFloats + kTile * kPStride) * sizeof(float);
  const dim3 grid(ceil_div(T_, kTile), B * NH);
  launch_with_shared<attention_forward_kernel<T, HD>>(grid, shared_bytes, stream, out, lse, qkv, T_,
                                                      C, NH, hd, scale);
}

template <class T, int HD>
void attention_backward_for(T* dqkv, const T* dout, const T* qkv, const float* lse,
                            const float* delta, int B, int T_, int C, int NH, cudaStream_t stream) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const dim3 grid(ceil_div(T_, kTile), B * NH);
  const size_t kv_bytes =
      (4 * TileShape<HD>::kFloats + 2 * kTile * kPStride + 2 * kTile) * sizeof(float);
  launch_with_shared<attention_backward_kv_kernel<T, HD>>(grid, kv_bytes, stream, dqkv, dout, qkv,
                                                          lse, delta, T_, C, NH, hd, scale);
  const size_t q_bytes = (4 * TileShape<HD>::kFloats + kTile * kPStride) * sizeof(float);
  launch_with_shared<attention_backward_q_kernel<T, HD>>(grid, q_bytes, stream, dqkv, dout, qkv,
                                                         lse, delta, T_, C, NH, hd, scale);
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH,
                       cudaStream_t stream) {
  check_shape(B, T_, C, NH);
  const int hd = C / NH;
  if (hd <= 32)
    attention_forward_for<T, 32>(out, lse, qkv, B, T_, C, NH, stream);
  else if (hd <= 64)
    attention_forward_for<T, 64>(out, lse, qkv, B, T_, C, NH, stream);
  else
    attention_forward_for<T, 128>(out, lse, qkv, B, T_, C, NH, stream);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                        int T_, int C, int NH, float* scratch, cudaStream_t stream) {
  check_shape(B, T_, C, NH);
  const int hd = C / NH;
  float* delta = scratch;
  const size_t warps = static_cast<size_t>(B) * T_ * NH;
  attention_delta_kernel<<<static_cast<unsigned>(ceil_div(warps, size_t{8})), 256, 0, stream>>>(
      delta, dout, out, B, T_, C, NH, hd);
  LAYUP_CUDA_CHECK_LAUNCH();
  if (hd <= 32)
    attention_backward_for<T, 32>(dqkv, dout, qkv, lse, delta, B, T_, C, NH, stream);
  else if (hd <= 64)
    attention_backward_for<T, 64>(dqkv, dout, qkv, lse, delta, B, T_, C, NH, stream);
  else
    attention_backward_for<T, 128>(dqkv, dout, qkv, lse, delta, B, T_, C, NH, stream);
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int,
                                       cudaStream_t);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, int,
                                               int, int, int, cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const float*, int, int, int, int, float*, cudaStream_t);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const __nv_bfloat16*,
                                                const float*, int, int, int, int, float*,
                                                cudaStream_t);

}  // namespace layup::cuda
