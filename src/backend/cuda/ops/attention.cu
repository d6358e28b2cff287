// Causal self-attention, forward and backward, flash-attention style (Dao et al., FlashAttention
// and FlashAttention-2), on the CUDA cores in fp32, with grouped key/value heads.
//
// For one batch row and query head (dropping b, h), with Q the head's [T, hd] slice of qkv, K and
// V the slices of the key/value head it reads, and scale = 1/sqrt(hd):
//
//   S = scale Q K^T,  P = softmax over each row of S restricted to u <= t,  O = P V
//
// Grouped heads. Query head h reads key/value head h / group, group = heads / kv_heads (GPT-2:
// group 1). The forward and the dQ kernel work per query head and only point at that head's K and
// V. A key/value head's dK and dV sum over its group's query heads, so the dK/dV kernel works per
// key/value head and loops over the group inside.
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
// D comes first from one small kernel. Then two kernels recompute P: one owns 32 key rows of a
// key/value head and, for each query head of the group in increasing order, walks the query tiles
// at or below the diagonal (accumulating dK and dV in registers across the whole group); the other
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

// What the kernels need of an AttentionShape, in the units they index with.
struct HeadLayout {
  int seq_len;
  int heads, kv_heads;
  int group;       // query heads per key/value head: query head h reads key/value head h / group
  int hd;          // head_dim
  int qkv_stride;  // elements from one position to the next in qkv and dqkv
  int out_stride;  // ... in out and dout
  int k_offset;    // channel of key head 0 in a qkv row
  int v_offset;    // channel of value head 0
  float scale;     // 1 / sqrt(hd)
};

HeadLayout head_layout(const AttentionShape& shape) {
  HeadLayout layout;
  layout.seq_len = shape.T;
  layout.heads = shape.heads;
  layout.kv_heads = shape.kv_heads;
  layout.group = shape.heads / shape.kv_heads;
  layout.hd = shape.head_dim;
  layout.qkv_stride = shape.qkv_width();
  layout.out_stride = shape.out_width();
  layout.k_offset = shape.heads * shape.head_dim;
  layout.v_offset = (shape.heads + shape.kv_heads) * shape.head_dim;
  layout.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  return layout;
}

// Position 0 of sequence b of the head whose channels start at `channel`, in a [B, T, stride]
// tensor.
template <class T>
__device__ inline T* head_start(T* tensor, int b, int T_, int stride, int channel) {
  return tensor + static_cast<size_t>(b) * T_ * stride + channel;
}

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

// 32 query rows of one query head: blockIdx.y = b * heads + h.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(T* out, float* lse, const T* qkv, HeadLayout layout) {
  using Shape = TileShape<HD>;
  constexpr int S = Shape::kStride;
  extern __shared__ float shared[];
  float* q_tile = shared;
  float* k_tile = q_tile + Shape::kFloats;
  float* v_tile = k_tile + Shape::kFloats;
  float* p_tile = v_tile + Shape::kFloats;  // [kTile][kPStride]

  const int T_ = layout.seq_len, hd = layout.hd;
  const int q_block = tile_count(T_) - 1 - blockIdx.x;  // the longest rows start first
  const int b = blockIdx.y / layout.heads, h = blockIdx.y % layout.heads;
  const int kv = h / layout.group;
  const T* q_head = head_start(qkv, b, T_, layout.qkv_stride, h * hd);
  const T* k_head = head_start(qkv, b, T_, layout.qkv_stride, layout.k_offset + kv * hd);
  const T* v_head = head_start(qkv, b, T_, layout.qkv_stride, layout.v_offset + kv * hd);
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int q0 = q_block * kTile, q = q0 + row;

  load_tile<HD>(q_tile, q_head, q0, T_, layout.qkv_stride, hd);
  float o[Shape::kChannels] = {};
  float m = -INFINITY, l = 0.0f;
  for (int k_block = 0; k_block <= q_block; ++k_block) {
    const int k0 = k_block * kTile;
    __syncthreads();  // the previous step's readers are done with k_tile, v_tile and p_tile
    load_tile<HD>(k_tile, k_head, k0, T_, layout.qkv_stride, hd);
    load_tile<HD>(v_tile, v_head, k0, T_, layout.qkv_stride, hd);
    __syncthreads();

    float s[kColumnsPerThread];
    row_dots<HD>(q_tile + row * S, k_tile, sub, s);
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int key = k0 + sub + kRowThreads * j;
      s[j] = (key <= q && key < T_) ? s[j] * layout.scale : -INFINITY;
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
    T* out_row = head_start(out, b, T_, layout.out_stride, h * hd) +
                 static_cast<size_t>(q) * layout.out_stride;
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
__global__ void attention_delta_kernel(float* delta, const T* dout, const T* out, int B,
                                       HeadLayout layout) {
  const size_t warp = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int T_ = layout.seq_len, heads = layout.heads, hd = layout.hd;
  if (warp >= static_cast<size_t>(B) * T_ * heads) return;
  const int h = static_cast<int>(warp % heads);
  const size_t bt = warp / heads;
  const size_t base = bt * layout.out_stride + h * hd;
  float sum = 0.0f;
  for (int d = lane; d < hd; d += 32) sum += to_float(dout[base + d]) * to_float(out[base + d]);
  sum = warp_sum(sum);
  const size_t b = bt / T_, t = bt % T_;
  if (lane == 0) delta[(b * heads + h) * T_ + t] = sum;
}

// dK and dV of 32 key rows of one key/value head (blockIdx.y = b * kv_heads + kv): for each query
// head of its group, walks the query tiles from the diagonal down.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                 const float* delta, HeadLayout layout) {
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

  const int T_ = layout.seq_len, hd = layout.hd;
  const int tiles = tile_count(T_);
  const int k_block = blockIdx.x;  // block 0 has the most query tiles and starts first
  const int b = blockIdx.y / layout.kv_heads, kv = blockIdx.y % layout.kv_heads;
  const int k_channel = layout.k_offset + kv * hd, v_channel = layout.v_offset + kv * hd;
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int k0 = k_block * kTile, key = k0 + row;

  load_tile<HD>(k_tile, head_start(qkv, b, T_, layout.qkv_stride, k_channel), k0, T_,
                layout.qkv_stride, hd);
  load_tile<HD>(v_tile, head_start(qkv, b, T_, layout.qkv_stride, v_channel), k0, T_,
                layout.qkv_stride, hd);
  float dk[Shape::kChannels] = {}, dv[Shape::kChannels] = {};
  // The group's query heads one after the other, in increasing order, into the same registers:
  // the one fixed summation order that keeps dK and dV deterministic without atomics.
  for (int h = kv * layout.group; h < (kv + 1) * layout.group; ++h) {
    const T* q_head = head_start(qkv, b, T_, layout.qkv_stride, h * hd);
    const T* dout_head = head_start(dout, b, T_, layout.out_stride, h * hd);
    const float* lse_row = lse + (static_cast<size_t>(b) * layout.heads + h) * T_;
    const float* delta_row = delta + (static_cast<size_t>(b) * layout.heads + h) * T_;
    for (int q_block = k_block; q_block < tiles; ++q_block) {
      const int q0 = q_block * kTile;
      __syncthreads();  // the previous step's readers are done with the query-side tiles
      load_tile<HD>(q_tile, q_head, q0, T_, layout.qkv_stride, hd);
      load_tile<HD>(do_tile, dout_head, q0, T_, layout.out_stride, hd);
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
        const float p = visible ? expf(s[j] * layout.scale - lse_tile[c]) : 0.0f;
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
  }

  if (key < T_) {
    const size_t key_row = static_cast<size_t>(key) * layout.qkv_stride;
    T* dk_row = head_start(dqkv, b, T_, layout.qkv_stride, k_channel) + key_row;
    T* dv_row = head_start(dqkv, b, T_, layout.qkv_stride, v_channel) + key_row;
#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) {
      const int d = sub + kRowThreads * i;
      if (d < hd) {
        dk_row[d] = from_float<T>(to_float(dk_row[d]) + layout.scale * dk[i]);
        dv_row[d] = from_float<T>(to_float(dv_row[d]) + dv[i]);
      }
    }
  }
}

// dQ of 32 query rows of one query head (blockIdx.y = b * heads + h), walking the key tiles up to
// the diagonal.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                const float* delta, HeadLayout layout) {
  using Shape = TileShape<HD>;
  constexpr int S = Shape::kStride;
  extern __shared__ float shared[];
  float* q_tile = shared;
  float* do_tile = q_tile + Shape::kFloats;
  float* k_tile = do_tile + Shape::kFloats;
  float* v_tile = k_tile + Shape::kFloats;
  float* ds_tile = v_tile + Shape::kFloats;  // [query row][key column]

  const int T_ = layout.seq_len, hd = layout.hd;
  const int q_block = tile_count(T_) - 1 - blockIdx.x;  // the longest rows start first
  const int b = blockIdx.y / layout.heads, h = blockIdx.y % layout.heads;
  const int kv = h / layout.group;
  const T* q_head = head_start(qkv, b, T_, layout.qkv_stride, h * hd);
  const T* k_head = head_start(qkv, b, T_, layout.qkv_stride, layout.k_offset + kv * hd);
  const T* v_head = head_start(qkv, b, T_, layout.qkv_stride, layout.v_offset + kv * hd);
  const T* dout_head = head_start(dout, b, T_, layout.out_stride, h * hd);
  const int row = threadIdx.x / kRowThreads, sub = threadIdx.x % kRowThreads;
  const int q0 = q_block * kTile, q = q0 + row;
  const float row_lse = q < T_ ? lse[static_cast<size_t>(blockIdx.y) * T_ + q] : 0.0f;
  const float row_delta = q < T_ ? delta[static_cast<size_t>(blockIdx.y) * T_ + q] : 0.0f;

  load_tile<HD>(q_tile, q_head, q0, T_, layout.qkv_stride, hd);
  load_tile<HD>(do_tile, dout_head, q0, T_, layout.out_stride, hd);
  float dq[Shape::kChannels] = {};
  for (int k_block = 0; k_block <= q_block; ++k_block) {
    const int k0 = k_block * kTile;
    __syncthreads();  // the previous step's readers are done with k_tile, v_tile and ds_tile
    load_tile<HD>(k_tile, k_head, k0, T_, layout.qkv_stride, hd);
    load_tile<HD>(v_tile, v_head, k0, T_, layout.qkv_stride, hd);
    __syncthreads();

    float s[kColumnsPerThread], dp[kColumnsPerThread];
    row_dots<HD>(q_tile + row * S, k_tile, sub, s);
    row_dots<HD>(do_tile + row * S, v_tile, sub, dp);
#pragma unroll
    for (int j = 0; j < kColumnsPerThread; ++j) {
      const int c = sub + kRowThreads * j, key = k0 + c;
      const bool visible = key <= q && q < T_ && key < T_;
      const float p = visible ? expf(s[j] * layout.scale - row_lse) : 0.0f;
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
    T* dq_row = head_start(dqkv, b, T_, layout.qkv_stride, h * hd) +
                static_cast<size_t>(q) * layout.qkv_stride;
#pragma unroll
    for (int i = 0; i < Shape::kChannels; ++i) {
      const int d = sub + kRowThreads * i;
      if (d < hd) dq_row[d] = from_float<T>(to_float(dq_row[d]) + layout.scale * dq[i]);
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

void check_shape(const AttentionShape& shape) {
  const auto [B, T_, heads, kv_heads, hd] = shape;
  LAYUP_CHECK(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "attention: kv_heads ",
              kv_heads, " does not divide heads ", heads);
  LAYUP_CHECK(hd >= 1 && hd <= kMaxAttentionHeadDim, "attention: head dimension ", hd,
              " is outside the 1 to ", kMaxAttentionHeadDim, " the CUDA kernels support");
  LAYUP_CHECK(static_cast<long long>(B) * heads <= 65535, "attention: B * heads = ", B, " * ",
              heads, " = ", static_cast<long long>(B) * heads,
              " exceeds the 65535 blocks of one grid dimension");
  LAYUP_CHECK(B >= 1 && T_ >= 1, "attention: empty batch (B=", B, ", T=", T_, ")");
}

template <class T, int HD>
void attention_forward_for(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                           cudaStream_t stream) {
  const size_t shared_bytes = (3 * TileShape<HD>::kFloats + kTile * kPStride) * sizeof(float);
  const dim3 grid(ceil_div(shape.T, kTile), shape.B * shape.heads);
  launch_with_shared<attention_forward_kernel<T, HD>>(grid, shared_bytes, stream, out, lse, qkv,
                                                      head_layout(shape));
}

template <class T, int HD>
void attention_backward_for(T* dqkv, const T* dout, const T* qkv, const float* lse,
                            const float* delta, const AttentionShape& shape, cudaStream_t stream) {
  const HeadLayout layout = head_layout(shape);
  const int tiles = ceil_div(shape.T, kTile);
  const size_t kv_bytes =
      (4 * TileShape<HD>::kFloats + 2 * kTile * kPStride + 2 * kTile) * sizeof(float);
  launch_with_shared<attention_backward_kv_kernel<T, HD>>(
      dim3(tiles, shape.B * shape.kv_heads), kv_bytes, stream, dqkv, dout, qkv, lse, delta, layout);
  const size_t q_bytes = (4 * TileShape<HD>::kFloats + kTile * kPStride) * sizeof(float);
  launch_with_shared<attention_backward_q_kernel<T, HD>>(
      dim3(tiles, shape.B * shape.heads), q_bytes, stream, dqkv, dout, qkv, lse, delta, layout);
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                       cudaStream_t stream) {
  check_shape(shape);
  if (shape.head_dim <= 32)
    attention_forward_for<T, 32>(out, lse, qkv, shape, stream);
  else if (shape.head_dim <= 64)
    attention_forward_for<T, 64>(out, lse, qkv, shape, stream);
  else
    attention_forward_for<T, 128>(out, lse, qkv, shape, stream);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        const AttentionShape& shape, float* scratch, cudaStream_t stream) {
  check_shape(shape);
  float* delta = scratch;
  const size_t warps = static_cast<size_t>(shape.B) * shape.T * shape.heads;
  attention_delta_kernel<<<static_cast<unsigned>(ceil_div(warps, size_t{8})), 256, 0, stream>>>(
      delta, dout, out, shape.B, head_layout(shape));
  LAYUP_CUDA_CHECK_LAUNCH();
  if (shape.head_dim <= 32)
    attention_backward_for<T, 32>(dqkv, dout, qkv, lse, delta, shape, stream);
  else if (shape.head_dim <= 64)
    attention_backward_for<T, 64>(dqkv, dout, qkv, lse, delta, shape, stream);
  else
    attention_backward_for<T, 128>(dqkv, dout, qkv, lse, delta, shape, stream);
}

template void attention_forward<float>(float*, float*, const float*, const AttentionShape&,
                                       cudaStream_t);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*,
                                               const AttentionShape&, cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*,
                                        const float*, const AttentionShape&, float*, cudaStream_t);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const __nv_bfloat16*,
                                                const float*, const AttentionShape&, float*,
                                                cudaStream_t);

}  // namespace layup::cuda
