// The CPU backend's two regions and the carve that both sizes and places them.
#include "backend/cpu/cpu_backend_buffers.h"

#include <algorithm>
#include <string>

#include "backend/arena_carver.h"
#include "core/error.h"

namespace layup {
namespace {

// The head's backward materializes dlogits this many floats at a time (64 MB), not [BT, Vp].
constexpr size_t kLogitsChunkFloats = size_t{16} << 20;

void check_shape(const ModelConfig& config, int max_batch, int max_seq_len) {
  validate_config(config);
  LAYUP_CHECK(max_batch >= 1 && max_seq_len >= 1, "the CPU backend needs a batch size and a ",
              "sequence length of at least 1 (got ", max_batch, " x ", max_seq_len, ")");
  check_sequence_length(config, max_seq_len);
}

}  // namespace

CpuRegionBytes carve_cpu_backend(const ModelConfig& config, int max_batch, int max_seq_len,
                                 char* activations, char* scratch, CpuBackendArena& arena) {
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t C = config.n_embd, NH = config.n_head, T = max_seq_len, L = config.n_layer;
  const size_t Vp = config.padded_vocab_size;
  const bool llama = config.is_llama();
  const size_t Q = config.qkv_width(), A = NH * config.head_dim();
  const size_t M = config.mlp_width(), F = (llama ? 2 : 1) * M;

  const std::string owner = "the CPU backend's buffers for batch " + std::to_string(max_batch) +
                            " x sequence length " + std::to_string(max_seq_len);
  ArenaCarver a(activations, kCpuArenaAlignBytes, owner);
  a.take(arena.inputs, BT);
  a.take(arena.targets, BT);
  arena.residual.assign(L + 1, nullptr);
  for (float*& residual : arena.residual) a.take(residual, BT, C);
  arena.blocks.assign(L, CpuBlockActivations{});
  for (CpuBlockActivations& block : arena.blocks) {
    a.take(block.ln_1, BT, C);
    if (!llama) a.take(block.ln_1_mean, BT);
    a.take(block.ln_1_rstd, BT);
    a.take(block.qkv, BT, Q);
    a.take(block.att, max_batch * NH, T * T);
    a.take(block.att_out, BT, A);
    a.take(block.residual_mid, BT, C);
    a.take(block.ln_2, BT, C);
    if (!llama) a.take(block.ln_2_mean, BT);
    a.take(block.ln_2_rstd, BT);
    a.take(block.fc, BT, F);
    a.take(block.fc_gelu, BT, M);
  }
  a.take(arena.ln_f, BT, C);
  if (!llama) a.take(arena.ln_f_mean, BT);
  a.take(arena.ln_f_rstd, BT);
  a.take(arena.logits, BT, Vp);
  a.take(arena.losses, BT);
  a.take(arena.logsumexp, BT);
  if (llama) {
    a.take(arena.rope_cos, T, config.head_dim() / 2);
    a.take(arena.rope_sin, T, config.head_dim() / 2);
  }

  ArenaCarver s(scratch, kCpuArenaAlignBytes, owner);
  s.take(arena.branch_out, BT, C);
  s.take(arena.d_residual, BT, C);
  s.take(arena.d_ln, BT, C);
  s.take(arena.d_att_out, BT, A);
  s.take(arena.d_qkv, BT, Q);
  s.take(arena.d_fc_gelu, BT, M);
  s.take(arena.d_fc, BT, F);
  const size_t chunk_rows = std::clamp<size_t>(kLogitsChunkFloats / Vp, 1, BT);
  arena.logits_chunk_rows = static_cast<int>(chunk_rows);
  s.take(arena.d_logits_chunk, chunk_rows, Vp);
  return {a.used(), s.used()};
}

BufferList cpu_backend_buffers(const ModelConfig& config, int max_batch, int max_seq_len) {
  check_shape(config, max_batch, max_seq_len);
  CpuBackendArena measured;
  const CpuRegionBytes bytes =
      carve_cpu_backend(config, max_batch, max_seq_len, nullptr, nullptr, measured);
  return {
      {MemorySide::kDevice, TensorClass::kActivations, MemoryKind::kHost, bytes.activations,
       "the CPU backend's activations for the backward (per block, with the B x heads x T x T "
       "attention probabilities), token ids, logits"},
      {MemorySide::kDevice, TensorClass::kScratch, MemoryKind::kHost, bytes.scratch,
       "the CPU backend's activation gradients and a chunk of the logits' gradient"},
  };
}

}  // namespace layup
