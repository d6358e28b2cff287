// The CUDA backend's buffers cut out of its three regions, one per tensor class (the bf16 compute
// copy of the weights, the activations, the backward's scratch), each piece 256-byte aligned
// (cuBLASLt's preferred alignment). Plain C++ and templated on the activations' element type T:
// the backend (cuda_backend.cu) carves with float or __nv_bfloat16 to place its pointers, and
// cuda_backend_buffers (cuda_backend_buffers.cpp) carves the same code with a 2-byte stand-in to
// measure the regions without a GPU, so the memory plan sums what the constructor allocates.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/arena_carver.h"
#include "backend/cuda/ops/scratch_floats.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup {

constexpr size_t kArenaAlignBytes = 256;

inline size_t arena_align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// The regions, one allocation each, of the tensor classes kWeights, kActivations and kScratch.
enum class ArenaRegion { kWeights, kActivations, kScratch };
constexpr int kArenaRegions = 3;

// Cuts buffers out of the three regions in order (ArenaCarver: each piece 256-byte aligned within
// its region; with null bases it only measures). region() says where the next takes come from.
class Carver {
 public:
  explicit Carver(const std::array<char*, kArenaRegions>& bases = {})
      : regions_{ArenaCarver(bases[0], kArenaAlignBytes, kOwner),
                 ArenaCarver(bases[1], kArenaAlignBytes, kOwner),
                 ArenaCarver(bases[2], kArenaAlignBytes, kOwner)} {}
  void region(ArenaRegion region) { region_ = static_cast<int>(region); }
  template <class U>
  void take(U*& pointer, size_t count) {
    regions_[region_].take(pointer, count);
  }
  size_t used(ArenaRegion region) const { return regions_[static_cast<int>(region)].used(); }

 private:
  static constexpr const char* kOwner = "the CUDA backend's buffers";
  std::array<ArenaCarver, kArenaRegions> regions_;
  int region_ = 0;
};

// What carve() cuts by, for one model, batch shape, --recompute level and activation type.
struct CudaArenaShape {
  // Positions (max_batch x max_seq_len), width, query heads, layers, padded vocabulary.
  size_t BT = 0, C = 0, NH = 0, L = 0, Vp = 0;
  // Widths per position of the fused q,k,v projection, of the attention's output (the heads
  // merged), of the MLP's first matmul (GPT-2's fc; the Llama family's gate and up together), and
  // of the MLP's activation (GELU's output; SwiGLU's): GPT-2 3C, C, 4C, 4C; the Llama family
  // (NH + 2 KVH) D, NH D, 2I, I.
  size_t qkv = 0, att = 0, fc = 0, act = 0;
  // The Llama family: RMSNorm (no means saved) and rotary tables, rope_rows x rope_half floats
  // each (max_seq_len x head_dim / 2); 0 for GPT-2.
  bool llama = false;
  size_t rope_rows = 0, rope_half = 0;
  int recompute = 0;  // the --recompute level (cuda_backend_buffers.h)
  // bf16 GPT-2: the MLP's GELU runs in the matmuls' epilogues (matmul.cuh), and its backward needs
  // no buffer for GELU's output gradient. fp32, the mode that must match the CPU to 1e-5, keeps the
  // separate GELU op, which computes exactly as the CPU's.
  bool fuse_gelu = false;
  // The ops' scratch: the largest any backward op asks for (scratch_floats.h).
  size_t scratch_floats = 0;
  // bf16: each span's offset in the compute copy of the weights (elements, layout order, each
  // 256-byte aligned; kComputeCopyElsewhere for a span whose copy the schedule places), and the
  // copy's length. Empty and 0 in fp32.
  static constexpr size_t kComputeCopyElsewhere = ~size_t{0};
  std::vector<size_t> compute_span_offsets;
  size_t compute_weights_count = 0;
};

template <class T>
CudaArenaShape cuda_arena_shape(const ModelConfig& config, int max_batch, int max_seq_len,
                                int recompute,
                                const std::vector<char>& compute_copy_elsewhere = {}) {
  CudaArenaShape shape;
  shape.BT = static_cast<size_t>(max_batch) * max_seq_len;
  shape.C = config.n_embd;
  shape.NH = config.n_head;
  shape.L = config.n_layer;
  shape.Vp = config.padded_vocab_size;
  shape.qkv = config.qkv_width();
  shape.att = static_cast<size_t>(config.n_head) * config.head_dim();
  shape.llama = config.is_llama();
  shape.fc = shape.llama ? 2 * static_cast<size_t>(config.mlp_width()) : 4 * shape.C;
  shape.act = shape.llama ? config.mlp_width() : 4 * shape.C;
  if (shape.llama) {
    shape.rope_rows = max_seq_len;
    shape.rope_half = config.head_dim() / 2;
  }
  shape.recompute = recompute;
  const int BT = static_cast<int>(shape.BT), C = config.n_embd;
  // The widest matmul output whose bias gradient is reduced (GPT-2's fc; a Qwen2 q,k,v), and the
  // norms' weight gradients (a layer norm's two columns sums cover an RMSNorm's one).
  const int widest_bias = static_cast<int>(std::max({shape.fc, shape.qkv, shape.C}));
  shape.scratch_floats =
      std::max({cuda::matmul_backward_scratch_floats(BT, widest_bias),
                cuda::layernorm_backward_scratch_floats(BT, C),
                cuda::attention_backward_scratch_floats(max_batch, max_seq_len, config.n_head)});
  if constexpr (!std::is_same_v<T, float>) {
    // Every buffer is 256-byte aligned, so only the width decides (matmul_gelu_fusable).
    shape.fuse_gelu = !shape.llama && (4 * C) % 8 == 0;
    const ParameterLayout layout(config);
    size_t offset = 0;
    for (size_t i = 0; i < layout.spans().size(); ++i) {
      const Span& span = layout.spans()[i];
      if (i < compute_copy_elsewhere.size() && compute_copy_elsewhere[i]) {
        shape.compute_span_offsets.push_back(CudaArenaShape::kComputeCopyElsewhere);
        continue;
      }
      shape.compute_span_offsets.push_back(offset);
      shape.compute_weights_count = offset + span.count;
      offset = arena_align_up(offset + span.count, kArenaAlignBytes / sizeof(T));
    }
  }
  return shape;
}

// Every buffer of the three regions. Rows are the B*T positions.
template <class T>
struct CudaArena {
  // What one transformer block saves in its forward for its backward (the widths are
  // CudaArenaShape's; the means are GPT-2's layer norms' only).
  struct BlockActivations {
    T* ln_1;                       // [BT,C]
    float *ln_1_mean, *ln_1_rstd;  // [BT]
    T* qkv;                        // [BT,qkv]; the Llama family's q and k rotated
    T* att_out;                    // [BT,att] heads merged, before the output projection
    float* att_lse;                // [B,NH,T] log-sum-exp of each score row
    T* residual_mid;               // [BT,C] x + attention branch
    T* ln_2;                       // [BT,C]
    float *ln_2_mean, *ln_2_rstd;  // [BT]
    T* fc;                         // [BT,fc] before the activation
    T* fc_gelu;                    // [BT,act] after it (GELU's or SwiGLU's output)
  };

  // Weights region (bf16 only): the compute copy, spans at CudaArenaShape::compute_span_offsets.
  T* compute_weights = nullptr;

  // Activations region. The last forward's batch: token ids, targets, and the embedding
  // backward's grouping.
  int32_t *tokens = nullptr, *targets = nullptr;
  int32_t *positions = nullptr, *segment_start = nullptr, *segment_token = nullptr;
  // The Llama family's rotary tables [max_seq_len, head_dim/2], written once at construction.
  float *rope_cos = nullptr, *rope_sin = nullptr;
  // residual[l] is block l's input; residual[L] is the input of ln_f.
  std::vector<T*> residual;
  std::vector<BlockActivations> blocks;
  T* ln_f = nullptr;                                 // [BT,C]
  float *ln_f_mean = nullptr, *ln_f_rstd = nullptr;  // [BT]
  T* logits = nullptr;                               // [BT,Vp]; dlogits after backward_head
  float *losses = nullptr, *logsumexp = nullptr;     // [BT]

  // Scratch region: a branch before its residual add; d_residual is dL/d(residual stream) where
  // the backward has reached; the rest are gradients of one block's intermediates, and the ops'
  // scratch for their deterministic reductions.
  T* branch_out = nullptr;   // [BT,C]
  T* d_residual = nullptr;   // [BT,C]
  T* d_ln = nullptr;         // [BT,C]
  T* d_att_out = nullptr;    // [BT,att]
  T* d_qkv = nullptr;        // [BT,qkv]
  T* d_fc_gelu = nullptr;    // [BT,act]; none when the GELU is fused
  T* d_fc = nullptr;         // [BT,fc]
  float* scratch = nullptr;  // [scratch_floats]

  void carve(Carver& carver, const CudaArenaShape& shape) {
    const size_t BT = shape.BT, C = shape.C, NH = shape.NH, L = shape.L, Vp = shape.Vp;
    const bool means = !shape.llama;  // RMSNorm saves no mean
    if (shape.compute_weights_count > 0) {
      carver.region(ArenaRegion::kWeights);
      carver.take(compute_weights, shape.compute_weights_count);
    }
    carver.region(ArenaRegion::kActivations);
    carver.take(tokens, BT);
    carver.take(targets, BT);
    carver.take(positions, BT);
    carver.take(segment_start, BT + 1);
    carver.take(segment_token, BT);
    if (shape.rope_rows > 0) {
      carver.take(rope_cos, shape.rope_rows * shape.rope_half);
      carver.take(rope_sin, shape.rope_rows * shape.rope_half);
    }

    residual.resize(L + 1);
    for (T*& r : residual) carver.take(r, BT * C);
    blocks.resize(L);
    // recompute 3: every block's forward writes one set, which each block's backward rewrites
    // from the block's input first (residual[l] stays per block).
    const bool one_set = shape.recompute >= 3;
    if (one_set) blocks.resize(1);
    // Recomputed activations live in one buffer that every block's forward writes and its own
    // backward rewrites just before reading (recompute >= 1: the MLP activation's output; >= 2:
    // both norms' outputs, which are never needed at the same time).
    T *shared_act = nullptr, *shared_ln = nullptr;
    if (shape.recompute >= 1) carver.take(shared_act, BT * shape.act);
    if (shape.recompute >= 2) carver.take(shared_ln, BT * C);
    for (BlockActivations& a : blocks) {
      a = {};
      if (shape.recompute >= 2)
        a.ln_1 = shared_ln;
      else
        carver.take(a.ln_1, BT * C);
      if (means) carver.take(a.ln_1_mean, BT);
      carver.take(a.ln_1_rstd, BT);
      carver.take(a.qkv, BT * shape.qkv);
      carver.take(a.att_out, BT * shape.att);
      carver.take(a.att_lse, BT * NH);
      carver.take(a.residual_mid, BT * C);
      if (shape.recompute >= 2)
        a.ln_2 = shared_ln;
      else
        carver.take(a.ln_2, BT * C);
      if (means) carver.take(a.ln_2_mean, BT);
      carver.take(a.ln_2_rstd, BT);
      carver.take(a.fc, BT * shape.fc);
      if (shape.recompute >= 1)
        a.fc_gelu = shared_act;
      else
        carver.take(a.fc_gelu, BT * shape.act);
    }
    if (one_set) blocks.assign(L, blocks.front());
    carver.take(ln_f, BT * C);
    if (means) carver.take(ln_f_mean, BT);
    carver.take(ln_f_rstd, BT);
    carver.take(logits, BT * Vp);
    carver.take(losses, BT);
    carver.take(logsumexp, BT);

    carver.region(ArenaRegion::kScratch);
    carver.take(branch_out, BT * C);
    carver.take(d_residual, BT * C);
    carver.take(d_ln, BT * C);
    carver.take(d_att_out, BT * shape.att);
    carver.take(d_qkv, BT * shape.qkv);
    if (!shape.fuse_gelu) carver.take(d_fc_gelu, BT * shape.act);  // the fused backward needs none
    carver.take(d_fc, BT * shape.fc);
    carver.take(scratch, shape.scratch_floats);
  }
};

}  // namespace layup
