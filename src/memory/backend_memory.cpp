// The backends' allocations, computed; see backend_memory.h for what each mirrors.
#include "memory/backend_memory.h"

#include <algorithm>
#include <cstdint>

#include "model/parameter_layout.h"

namespace layup {

namespace {

// The CPU backend materializes dlogits this many floats at a time (kLogitsChunkFloats in
// cpu_backend.cpp).
constexpr size_t kCpuLogitsChunkFloats = size_t{16} << 20;

// The CUDA carver's alignment (kAlignBytes in cuda_backend.cu).
constexpr size_t kArenaAlignBytes = 256;

size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// column_reduce_chunks / column_reduce_scratch_floats of backend/cuda/ops/common.cuh.
size_t column_reduce_scratch_floats(size_t N, size_t C, size_t outputs) {
  const size_t chunks = std::clamp<size_t>((N + 63) / 64, 1, 128);
  return outputs * chunks * C;
}

// The carver of cuda_backend.cu, counting by class: each piece starts at the next 256-byte
// boundary, and the padding before it is charged to the piece's class.
class ArenaCounter {
 public:
  void take(size_t& bytes_of_class, size_t count, size_t element_bytes) {
    const size_t start = align_up(used_, kArenaAlignBytes);
    const size_t end = start + count * element_bytes;
    bytes_of_class += end - used_;
    used_ = end;
  }

 private:
  size_t used_ = 0;
};

}  // namespace

BackendBytes cpu_backend_memory(const Gpt2Config& config, int max_batch, int max_seq_len) {
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t C = config.n_embd, NH = config.n_head, T = max_seq_len, L = config.n_layer;
  const size_t Vp = config.padded_vocab_size;
  const size_t f = sizeof(float);
  BackendBytes bytes;
  // inputs_, targets_ (int32); residual_[0..L]; each block's saved activations; ln_f_ and its
  // statistics; logits_, losses_, logsumexp_.
  // One block: ln_1, att_out, residual_mid, ln_2 (BTC each), qkv (3 BTC), the attention
  // probabilities (B NH T T), fc and fc_gelu (4 BTC each), the two layer norms' means and rstds.
  const size_t per_block =
      4 * BT * C + 3 * BT * C + static_cast<size_t>(max_batch) * NH * T * T + 8 * BT * C + 4 * BT;
  bytes.activations = 2 * BT * sizeof(int32_t) +
                      f * ((L + 1) * BT * C + L * per_block + BT * C + 2 * BT + BT * Vp + 2 * BT);
  // branch_out_, d_residual_, d_ln_, d_att_out_ (BTC each), d_qkv_ (3 BTC), d_fc_gelu_, d_fc_
  // (4 BTC each), and one chunk of dlogits.
  const size_t logits_chunk_rows = std::clamp<size_t>(kCpuLogitsChunkFloats / Vp, 1, BT);
  bytes.scratch = f * (4 * BT * C + 3 * BT * C + 8 * BT * C + logits_chunk_rows * Vp);
  return bytes;
}

BackendBytes cuda_arena_bytes(const Gpt2Config& config, int max_batch, int max_seq_len, bool bf16,
                              int recompute) {
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t C = config.n_embd, NH = config.n_head, L = config.n_layer;
  const size_t Vp = config.padded_vocab_size;
  const size_t t = bf16 ? 2 : 4;  // sizeof(T): the activations' element type
  const size_t f = sizeof(float), i32 = sizeof(int32_t);
  const bool fuse_gelu = bf16 && (4 * C) % 8 == 0;
  const size_t scratch_floats =
      std::max({column_reduce_scratch_floats(BT, 4 * C, 1), column_reduce_scratch_floats(BT, C, 2),
                static_cast<size_t>(max_batch) * max_seq_len * NH});

  // One region per class, each its own allocation starting aligned (cuda_backend.cu's carve()).
  BackendBytes bytes;
  ArenaCounter weights_region, activations_region, scratch_region;
  if (bf16) {
    // The compute copy: every span at a 256-byte aligned offset inside it.
    const ParameterLayout layout(config);
    size_t offset = 0, last = 0;
    for (const Span& span : layout.spans()) {
      last = offset;
      offset = align_up(offset + span.count, kArenaAlignBytes / t);
    }
    weights_region.take(bytes.weights, last + layout.spans().back().count, t);
  }
  ArenaCounter& arena = activations_region;
  size_t& a = bytes.activations;
  for (size_t n : {BT, BT, BT, BT + 1, BT}) arena.take(a, n, i32);  // tokens .. segment_token
  for (size_t l = 0; l <= L; ++l) arena.take(a, BT * C, t);         // residual_
  if (recompute >= 1) arena.take(a, BT * 4 * C, t);                 // shared GELU output
  if (recompute >= 2) arena.take(a, BT * C, t);                     // shared layer-norm output
  for (size_t l = 0; l < L; ++l) {
    if (recompute < 2) arena.take(a, BT * C, t);      // ln_1
    arena.take(a, BT, f);                             // ln_1_mean
    arena.take(a, BT, f);                             // ln_1_rstd
    arena.take(a, BT * 3 * C, t);                     // qkv
    arena.take(a, BT * C, t);                         // att_out
    arena.take(a, BT * NH, f);                        // att_lse
    arena.take(a, BT * C, t);                         // residual_mid
    if (recompute < 2) arena.take(a, BT * C, t);      // ln_2
    arena.take(a, BT, f);                             // ln_2_mean
    arena.take(a, BT, f);                             // ln_2_rstd
    arena.take(a, BT * 4 * C, t);                     // fc
    if (recompute < 1) arena.take(a, BT * 4 * C, t);  // fc_gelu
  }
  arena.take(a, BT * C, t);   // ln_f_
  arena.take(a, BT, f);       // ln_f_mean_
  arena.take(a, BT, f);       // ln_f_rstd_
  arena.take(a, BT * Vp, t);  // logits_
  arena.take(a, BT, f);       // losses_
  arena.take(a, BT, f);       // logsumexp_
  size_t& s = bytes.scratch;
  ArenaCounter& scratch = scratch_region;
  scratch.take(s, BT * C, t);                      // branch_out_
  scratch.take(s, BT * C, t);                      // d_residual_
  scratch.take(s, BT * C, t);                      // d_ln_
  scratch.take(s, BT * C, t);                      // d_att_out_
  scratch.take(s, BT * 3 * C, t);                  // d_qkv_
  if (!fuse_gelu) scratch.take(s, BT * 4 * C, t);  // d_fc_gelu_
  scratch.take(s, BT * 4 * C, t);                  // d_fc_
  scratch.take(s, scratch_floats, f);              // scratch_
  return bytes;
}

size_t cuda_pinned_staging_bytes(int max_batch, int max_seq_len) {
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  return (5 * BT + 1) * sizeof(int32_t) + BT * sizeof(float);
}

}  // namespace layup
