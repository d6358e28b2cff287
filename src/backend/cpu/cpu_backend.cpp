// GPT-2 on the CPU ops: the pre-LN block, the tied LM head, and backward cut at block boundaries.
//
//   x_0 = wte[tokens] + wpe[0:T]
//   block l:  mid = x + c_proj(attention(c_attn(ln_1(x))))
//             x'  = mid + mlp_proj(gelu(mlp_fc(ln_2(mid))))
//   logits = ln_f(x_L) wte^T          (over the padded vocabulary; padded wte rows are zero)
//   loss   = mean over positions of the cross-entropy over the real vocabulary
//
// A residual add passes its gradient to both summands unchanged, so the backward never copies
// the residual stream's gradient: d_residual_ serves as the gradient of the block output and
// of the branch output at once, and each layer norm's input gradient is accumulated into it.
//
// The Llama family (Llama, Qwen2, Mistral) has the same skeleton with other parts:
//
//   x_0 = embed_tokens[tokens]                         (no position table)
//   block l:  q, k, v = qkv_proj(rmsnorm_1(x)); q, k = rope(q), rope(k)
//             mid = x + o_proj(attention(q, k, v))     (K/V heads shared by groups of q heads)
//             x'  = mid + down_proj(silu(gate_proj(h)) * up_proj(h)),  h = rmsnorm_2(mid)
//   logits = rmsnorm_f(x_L) W^T,  W = embed_tokens when tied, else lm_head (in the head's span)
//
// Rotary positions are applied to the saved qkv in place; the rotation is linear, so its backward
// needs only the angles (rope.h).
//
// Forward hooks (model_backend.h) are called right before the ops that first read each span:
// the embedding lookup, each block's first norm, and the final norm.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "backend/cpu/ops/attention.h"
#include "backend/cpu/ops/classifier.h"
#include "backend/cpu/ops/embedding.h"
#include "backend/cpu/ops/gelu.h"
#include "backend/cpu/ops/layernorm.h"
#include "backend/cpu/ops/matmul.h"
#include "backend/cpu/ops/residual.h"
#include "backend/cpu/ops/rmsnorm.h"
#include "backend/cpu/ops/rope.h"
#include "backend/cpu/ops/swiglu.h"
#include "core/error.h"
#include "memory/parallel_pages.h"

namespace layup {
namespace {

const ModelConfig& validated(const ModelConfig& config) {
  validate_config(config);
  return config;
}

// One region of cpu_backend_buffers, zeroed as the std::vectors it replaced were.
char* allocate_zeroed(const PlannedAllocation& buffer, int max_batch, int max_seq_len) {
  void* data = ::operator new(buffer.bytes, std::align_val_t(kCpuArenaAlignBytes), std::nothrow);
  LAYUP_CHECK(data != nullptr, "out of host memory allocating ", format_bytes(buffer.bytes),
              " for ", buffer.what, " at B=", max_batch, ", T=", max_seq_len,
              ", although the memory plan fitted: something else may hold the memory (or a limit "
              "the plan cannot see, such as ulimit -v). Try a smaller --batch or --seq-len, or "
              "see what the run needs with `layup memory`");
  zero_in_parallel(data, buffer.bytes);
  return static_cast<char*>(data);
}

void zero(float* buffer, size_t count) {
  std::fill_n(buffer, count, 0.0f);
}

// A tensor of the span at `base`, or null where the model has none (kAbsent).
template <class T>
T* tensor_at(T* base, size_t offset) {
  return offset == kAbsent ? nullptr : base + offset;
}

}  // namespace

CpuBackend::CpuBackend(const ModelConfig& config, int max_batch, int max_seq_len,
                       std::shared_ptr<MemoryAccountant> accountant)
    : config_(validated(config)),
      layout_(config),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  // Allocates the list the memory plan sums, then places every buffer in it with the same carve
  // that sized it (cpu_backend_buffers.cpp): what is planned is what is allocated and recorded.
  for (const PlannedAllocation& buffer : cpu_backend_buffers(config, max_batch, max_seq_len)) {
    LAYUP_CHECK(buffer.tensor_class == TensorClass::kActivations ||
                    buffer.tensor_class == TensorClass::kScratch,
                "the CPU backend has no region for ", tensor_class_label(buffer.tensor_class));
    (buffer.tensor_class == TensorClass::kActivations ? activations_region_ : scratch_region_)
        .reset(allocate_zeroed(buffer, max_batch, max_seq_len));
    records_.push_back(record_planned(accountant, buffer));
  }
  carve_cpu_backend(config, max_batch, max_seq_len, activations_region_.get(),
                    scratch_region_.get(), arena_);
  if (config.is_llama()) {
    // Positions are 0..T-1 in every sequence, so one table of max_seq_len rows serves them all.
    std::vector<float> inv_freq(config.head_dim() / 2);
    rope_inverse_frequencies(inv_freq.data(), config.head_dim(), config.rope_theta,
                             config.rope_scaling);
    rope_cos_sin(arena_.rope_cos, arena_.rope_sin, inv_freq.data(), max_seq_len, config.head_dim());
  }
}

void CpuBackend::AlignedDelete::operator()(char* data) const {
  ::operator delete(data, std::align_val_t(kCpuArenaAlignBytes));
}

void CpuBackend::check_batch(const ParameterPointers& params, const TokenBatch& batch) const {
  check_token_batch("CPU", config_, max_batch_, max_seq_len_, params, batch);
}

float CpuBackend::forward(const ParameterPointers& params, const TokenBatch& batch,
                          ForwardHooks& hooks) {
  check_batch(params, batch);
  batch_ = batch.batch;
  seq_len_ = batch.seq_len;
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, L = config_.n_layer;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const float eps = config_.layer_norm_epsilon;
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();

  std::copy_n(batch.inputs, BT, arena_.inputs);
  hooks.before_embeddings();
  embedding_forward(arena_.residual[0], arena_.inputs, params.embeddings + e.wte,
                    tensor_at(params.embeddings, e.wpe), B, T, C);

  for (int l = 0; l < L; ++l) {
    hooks.before_block(l);
    if (config_.is_llama())
      llama_block_forward(l, params.blocks[l], arena_.residual[l]);
    else
      gpt2_block_forward(l, params.blocks[l], arena_.residual[l]);
  }

  hooks.before_head();
  if (config_.is_llama())
    rmsnorm_forward(arena_.ln_f, arena_.ln_f_rstd, arena_.residual[L], params.final_norm + f.weight,
                    BT, C, eps);
  else
    layernorm_forward(arena_.ln_f, arena_.ln_f_mean, arena_.ln_f_rstd, arena_.residual[L],
                      params.final_norm + f.weight, params.final_norm + f.bias, BT, C, eps);
  const float* head =
      config_.tie_word_embeddings ? params.embeddings + e.wte : params.final_norm + f.lm_head;
  matmul_forward(arena_.logits, arena_.ln_f, head, nullptr, BT, C, Vp);

  if (!batch.targets) {
    next_step_ = BackwardStep::kNeedsForwardWithTargets;
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::copy_n(batch.targets, BT, arena_.targets);
  classifier_forward(arena_.losses, arena_.logsumexp, arena_.logits, arena_.targets, BT, V, Vp);
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += arena_.losses[n];
  next_step_ = BackwardStep::kHead;
  return static_cast<float>(total / BT);
}

void CpuBackend::gpt2_block_forward(int layer, const float* p, const float* x) {
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, NH = config_.n_head;
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  CpuBlockActivations& a = arena_.blocks[layer];
  layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, x, p + o.ln_1_weight, p + o.ln_1_bias, BT, C,
                    eps);
  matmul_forward(a.qkv, a.ln_1, p + o.attn_qkv_weight, p + o.attn_qkv_bias, BT, C, 3 * C);
  attention_forward(a.att_out, a.att, a.qkv, B, T, C, NH);
  matmul_forward(arena_.branch_out, a.att_out, p + o.attn_proj_weight, p + o.attn_proj_bias, BT, C,
                 C);
  residual_forward(a.residual_mid, x, arena_.branch_out, BT * C);

  layernorm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight,
                    p + o.ln_2_bias, BT, C, eps);
  matmul_forward(a.fc, a.ln_2, p + o.mlp_fc_weight, p + o.mlp_fc_bias, BT, C, 4 * C);
  gelu_forward(a.fc_gelu, a.fc, BT * 4 * C);
  matmul_forward(arena_.branch_out, a.fc_gelu, p + o.mlp_proj_weight, p + o.mlp_proj_bias, BT,
                 4 * C, C);
  residual_forward(arena_.residual[layer + 1], a.residual_mid, arena_.branch_out, BT * C);
}

void CpuBackend::llama_block_forward(int layer, const float* p, const float* x) {
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, NH = config_.n_head, KVH = config_.kv_heads();
  const int D = config_.head_dim(), Q = config_.qkv_width(), A = NH * D, I = config_.mlp_width();
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  CpuBlockActivations& a = arena_.blocks[layer];
  rmsnorm_forward(a.ln_1, a.ln_1_rstd, x, p + o.ln_1_weight, BT, C, eps);
  matmul_forward(a.qkv, a.ln_1, p + o.attn_qkv_weight, tensor_at(p, o.attn_qkv_bias), BT, C, Q);
  // q's and k's heads are adjacent in each row: one rotation covers both, v is left alone.
  rope_forward(a.qkv, a.qkv, arena_.rope_cos, arena_.rope_sin, B, T, NH + KVH, D, Q);
  grouped_query_attention_forward(a.att_out, a.att, a.qkv, B, T, NH, KVH, D);
  matmul_forward(arena_.branch_out, a.att_out, p + o.attn_proj_weight,
                 tensor_at(p, o.attn_proj_bias), BT, A, C);
  residual_forward(a.residual_mid, x, arena_.branch_out, BT * C);

  rmsnorm_forward(a.ln_2, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight, BT, C, eps);
  matmul_forward(a.fc, a.ln_2, p + o.mlp_fc_weight, nullptr, BT, C, 2 * I);
  swiglu_forward(a.fc_gelu, a.fc, BT, I);
  matmul_forward(arena_.branch_out, a.fc_gelu, p + o.mlp_proj_weight, nullptr, BT, I, C);
  residual_forward(arena_.residual[layer + 1], a.residual_mid, arena_.branch_out, BT * C);
}

void CpuBackend::backward_head(const ParameterPointers& params, float* final_norm_grad,
                               float* embeddings_grad, float loss_scale) {
  LAYUP_CHECK(next_step_ != BackwardStep::kNeedsForwardWithTargets,
              "backward_head needs a forward pass with targets first");
  LAYUP_CHECK(next_step_ == BackwardStep::kHead,
              "backward_head called in the middle of a backward pass; finish it with the blocks "
              "and backward_embeddings first");
  const int BT = batch_ * seq_len_, C = config_.n_embd;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();
  const float dloss = loss_scale / BT;  // d(mean loss) / d(loss of one position), scaled

  // The CPU ops add into their weight gradients; the head's and the blocks' gradients are
  // overwritten (ModelBackend), so they start from zero here.
  std::fill_n(final_norm_grad, layout_.final_norm().count, 0.0f);
  std::fill_n(embeddings_grad, e.count, 0.0f);

  // The head's weight: the token embedding when tied, else lm_head in the final norm's span.
  const bool tied = config_.tie_word_embeddings;
  const float* head = tied ? params.embeddings + e.wte : params.final_norm + f.lm_head;
  float* head_grad = tied ? embeddings_grad + e.wte : final_norm_grad + f.lm_head;
  // logits = ln_f head^T, in chunks of positions so that dlogits never exists whole.
  zero(arena_.d_ln, static_cast<size_t>(BT) * C);
  const int chunks = (BT + arena_.logits_chunk_rows - 1) / arena_.logits_chunk_rows;
  const int rows_per_chunk = (BT + chunks - 1) / chunks;
  for (int first = 0; first < BT; first += rows_per_chunk) {
    const int rows = std::min(rows_per_chunk, BT - first);
    classifier_backward(arena_.d_logits_chunk, arena_.logits + static_cast<size_t>(first) * Vp,
                        arena_.logsumexp + first, arena_.targets + first, rows, V, Vp, dloss);
    matmul_backward(arena_.d_ln + static_cast<size_t>(first) * C, head_grad, nullptr,
                    arena_.d_logits_chunk, arena_.ln_f + static_cast<size_t>(first) * C, head, rows,
                    C, Vp);
  }

  zero(arena_.d_residual, static_cast<size_t>(BT) * C);
  if (config_.is_llama())
    rmsnorm_backward(arena_.d_residual, final_norm_grad + f.weight, arena_.d_ln,
                     arena_.residual[config_.n_layer], params.final_norm + f.weight,
                     arena_.ln_f_rstd, BT, C);
  else
    layernorm_backward(arena_.d_residual, final_norm_grad + f.weight, final_norm_grad + f.bias,
                       arena_.d_ln, arena_.residual[config_.n_layer], params.final_norm + f.weight,
                       arena_.ln_f_mean, arena_.ln_f_rstd, BT, C);
  next_step_ = BackwardStep::kBlock;
  next_layer_ = config_.n_layer - 1;
}

void CpuBackend::backward_block(int layer, const ParameterPointers& params, float* block_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kBlock && layer == next_layer_, "backward_block(", layer,
              ") is out of order: backward runs backward_head, then blocks ", config_.n_layer - 1,
              " down to 0, then backward_embeddings",
              next_step_ == BackwardStep::kBlock ? "; the next block is " : "",
              next_step_ == BackwardStep::kBlock ? std::to_string(next_layer_) : "");
  if (config_.is_llama())
    llama_block_backward(layer, params.blocks[layer], block_grad);
  else
    gpt2_block_backward(layer, params.blocks[layer], block_grad);

  next_layer_ = layer - 1;
  if (layer == 0) next_step_ = BackwardStep::kEmbeddings;
}

void CpuBackend::gpt2_block_backward(int layer, const float* p, float* g) {
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, NH = config_.n_head;
  const BlockOffsets& o = layout_.block();
  const CpuBlockActivations& a = arena_.blocks[layer];

  std::fill_n(g, o.count, 0.0f);  // overwritten (ModelBackend); the ops below add into it

  // MLP branch. d_residual_ holds dL/d(block output) = dL/d(MLP output).
  zero(arena_.d_fc_gelu, static_cast<size_t>(BT) * 4 * C);
  matmul_backward(arena_.d_fc_gelu, g + o.mlp_proj_weight, g + o.mlp_proj_bias, arena_.d_residual,
                  a.fc_gelu, p + o.mlp_proj_weight, BT, 4 * C, C);
  zero(arena_.d_fc, static_cast<size_t>(BT) * 4 * C);
  gelu_backward(arena_.d_fc, a.fc, arena_.d_fc_gelu, BT * 4 * C);
  zero(arena_.d_ln, static_cast<size_t>(BT) * C);
  matmul_backward(arena_.d_ln, g + o.mlp_fc_weight, g + o.mlp_fc_bias, arena_.d_fc, a.ln_2,
                  p + o.mlp_fc_weight, BT, C, 4 * C);
  // Adding ln_2's input gradient turns d_residual_ into dL/d(residual_mid).
  layernorm_backward(arena_.d_residual, g + o.ln_2_weight, g + o.ln_2_bias, arena_.d_ln,
                     a.residual_mid, p + o.ln_2_weight, a.ln_2_mean, a.ln_2_rstd, BT, C);

  // Attention branch. d_residual_ holds dL/d(residual_mid) = dL/d(attention branch output).
  zero(arena_.d_att_out, static_cast<size_t>(BT) * C);
  matmul_backward(arena_.d_att_out, g + o.attn_proj_weight, g + o.attn_proj_bias, arena_.d_residual,
                  a.att_out, p + o.attn_proj_weight, BT, C, C);
  zero(arena_.d_qkv, static_cast<size_t>(BT) * 3 * C);
  attention_backward(arena_.d_qkv, arena_.d_att_out, a.qkv, a.att, B, T, C, NH);
  zero(arena_.d_ln, static_cast<size_t>(BT) * C);
  matmul_backward(arena_.d_ln, g + o.attn_qkv_weight, g + o.attn_qkv_bias, arena_.d_qkv, a.ln_1,
                  p + o.attn_qkv_weight, BT, C, 3 * C);
  // Adding ln_1's input gradient turns d_residual_ into dL/d(block input).
  layernorm_backward(arena_.d_residual, g + o.ln_1_weight, g + o.ln_1_bias, arena_.d_ln,
                     arena_.residual[layer], p + o.ln_1_weight, a.ln_1_mean, a.ln_1_rstd, BT, C);
}

void CpuBackend::llama_block_backward(int layer, const float* p, float* g) {
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, NH = config_.n_head, KVH = config_.kv_heads();
  const int D = config_.head_dim(), Q = config_.qkv_width(), A = NH * D, I = config_.mlp_width();
  const BlockOffsets& o = layout_.block();
  const CpuBlockActivations& a = arena_.blocks[layer];

  std::fill_n(g, o.count, 0.0f);  // overwritten (ModelBackend); the ops below add into it

  // MLP branch. d_residual_ holds dL/d(block output) = dL/d(MLP output).
  zero(arena_.d_fc_gelu, static_cast<size_t>(BT) * I);
  matmul_backward(arena_.d_fc_gelu, g + o.mlp_proj_weight, nullptr, arena_.d_residual, a.fc_gelu,
                  p + o.mlp_proj_weight, BT, I, C);
  zero(arena_.d_fc, static_cast<size_t>(BT) * 2 * I);
  swiglu_backward(arena_.d_fc, arena_.d_fc_gelu, a.fc, BT, I);
  zero(arena_.d_ln, static_cast<size_t>(BT) * C);
  matmul_backward(arena_.d_ln, g + o.mlp_fc_weight, nullptr, arena_.d_fc, a.ln_2,
                  p + o.mlp_fc_weight, BT, C, 2 * I);
  // Adding the norm's input gradient turns d_residual_ into dL/d(residual_mid).
  rmsnorm_backward(arena_.d_residual, g + o.ln_2_weight, arena_.d_ln, a.residual_mid,
                   p + o.ln_2_weight, a.ln_2_rstd, BT, C);

  // Attention branch.
  zero(arena_.d_att_out, static_cast<size_t>(BT) * A);
  matmul_backward(arena_.d_att_out, g + o.attn_proj_weight, tensor_at(g, o.attn_proj_bias),
                  arena_.d_residual, a.att_out, p + o.attn_proj_weight, BT, A, C);
  zero(arena_.d_qkv, static_cast<size_t>(BT) * Q);
  grouped_query_attention_backward(arena_.d_qkv, arena_.d_att_out, a.qkv, a.att, B, T, NH, KVH, D);
  // From the rotated q and k back to the projections' outputs, in place.
  rope_backward(arena_.d_qkv, arena_.d_qkv, arena_.rope_cos, arena_.rope_sin, B, T, NH + KVH, D, Q);
  zero(arena_.d_ln, static_cast<size_t>(BT) * C);
  matmul_backward(arena_.d_ln, g + o.attn_qkv_weight, tensor_at(g, o.attn_qkv_bias), arena_.d_qkv,
                  a.ln_1, p + o.attn_qkv_weight, BT, C, Q);
  // Adding the norm's input gradient turns d_residual_ into dL/d(block input).
  rmsnorm_backward(arena_.d_residual, g + o.ln_1_weight, arena_.d_ln, arena_.residual[layer],
                   p + o.ln_1_weight, a.ln_1_rstd, BT, C);
}

void CpuBackend::backward_embeddings(const ParameterPointers& /*params*/, float* embeddings_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kEmbeddings,
              "backward_embeddings called before the backward of block 0");
  const EmbeddingOffsets& e = layout_.embeddings();
  embedding_backward(embeddings_grad + e.wte, tensor_at(embeddings_grad, e.wpe), arena_.d_residual,
                     arena_.inputs, batch_, seq_len_, config_.n_embd);
  // The forward's activations are intact, so the same backward may be run again.
  next_step_ = BackwardStep::kHead;
}

std::unique_ptr<ModelBackend> make_cpu_backend(const ModelConfig& config, int max_batch,
                                               int max_seq_len,
                                               std::shared_ptr<MemoryAccountant> accountant) {
  return std::make_unique<CpuBackend>(config, max_batch, max_seq_len, std::move(accountant));
}

}  // namespace layup
