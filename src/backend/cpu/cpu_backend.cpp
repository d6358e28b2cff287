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
// Forward hooks (model_backend.h) are called right before the ops that first read each span:
// the embedding lookup, each block's ln_1, and ln_f.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "backend/cpu/ops/attention.h"
#include "backend/cpu/ops/classifier.h"
#include "backend/cpu/ops/embedding.h"
#include "backend/cpu/ops/gelu.h"
#include "backend/cpu/ops/layernorm.h"
#include "backend/cpu/ops/matmul.h"
#include "backend/cpu/ops/residual.h"
#include "core/error.h"

namespace layup {
namespace {

// The head's backward materializes dlogits this many floats at a time (64 MB), not [BT, Vp].
constexpr size_t kLogitsChunkFloats = size_t{16} << 20;

const Gpt2Config& validated(const Gpt2Config& config) {
  validate_config(config);
  return config;
}

void zero(std::vector<float>& buffer, size_t count) {
  std::fill_n(buffer.data(), count, 0.0f);
}

}  // namespace

CpuBackend::CpuBackend(const Gpt2Config& config, int max_batch, int max_seq_len)
    : config_(validated(config)),
      layout_(config),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len) {
  LAYUP_CHECK(max_batch >= 1 && max_seq_len >= 1, "the CPU backend needs a batch size and a ",
              "sequence length of at least 1 (got ", max_batch, " x ", max_seq_len, ")");
  LAYUP_CHECK(max_seq_len <= config.n_positions, "sequence length ", max_seq_len,
              " exceeds the model's context of ", config.n_positions, " positions; use --seq-len ",
              config.n_positions, " or less, or a model with a longer --context");

  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const size_t C = config.n_embd, NH = config.n_head, T = max_seq_len;
  const size_t Vp = config.padded_vocab_size;
  logits_chunk_rows_ = static_cast<int>(std::clamp<size_t>(kLogitsChunkFloats / Vp, 1, BT));

  inputs_.resize(BT);
  targets_.resize(BT);
  residual_.assign(config.n_layer + 1, std::vector<float>(BT * C));
  blocks_.resize(config.n_layer);
  for (BlockActivations& block : blocks_) {
    block.ln_1.resize(BT * C);
    block.ln_1_mean.resize(BT);
    block.ln_1_rstd.resize(BT);
    block.qkv.resize(BT * 3 * C);
    block.att.resize(max_batch * NH * T * T);
    block.att_out.resize(BT * C);
    block.residual_mid.resize(BT * C);
    block.ln_2.resize(BT * C);
    block.ln_2_mean.resize(BT);
    block.ln_2_rstd.resize(BT);
    block.fc.resize(BT * 4 * C);
    block.fc_gelu.resize(BT * 4 * C);
  }
  ln_f_.resize(BT * C);
  ln_f_mean_.resize(BT);
  ln_f_rstd_.resize(BT);
  logits_.resize(BT * Vp);
  losses_.resize(BT);
  logsumexp_.resize(BT);
  branch_out_.resize(BT * C);

  d_residual_.resize(BT * C);
  d_ln_.resize(BT * C);
  d_att_out_.resize(BT * C);
  d_qkv_.resize(BT * 3 * C);
  d_fc_gelu_.resize(BT * 4 * C);
  d_fc_.resize(BT * 4 * C);
  d_logits_chunk_.resize(logits_chunk_rows_ * Vp);
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
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();

  std::copy_n(batch.inputs, BT, inputs_.data());
  hooks.before_embeddings();
  embedding_forward(residual_[0].data(), inputs_.data(), params.embeddings + e.wte,
                    params.embeddings + e.wpe, B, T, C);

  for (int l = 0; l < L; ++l) {
    hooks.before_block(l);
    const float* p = params.blocks[l];
    BlockActivations& a = blocks_[l];
    const float* x = residual_[l].data();
    layernorm_forward(a.ln_1.data(), a.ln_1_mean.data(), a.ln_1_rstd.data(), x, p + o.ln_1_weight,
                      p + o.ln_1_bias, BT, C, eps);
    matmul_forward(a.qkv.data(), a.ln_1.data(), p + o.attn_qkv_weight, p + o.attn_qkv_bias, BT, C,
                   3 * C);
    attention_forward(a.att_out.data(), a.att.data(), a.qkv.data(), B, T, C, NH);
    matmul_forward(branch_out_.data(), a.att_out.data(), p + o.attn_proj_weight,
                   p + o.attn_proj_bias, BT, C, C);
    residual_forward(a.residual_mid.data(), x, branch_out_.data(), BT * C);

    layernorm_forward(a.ln_2.data(), a.ln_2_mean.data(), a.ln_2_rstd.data(), a.residual_mid.data(),
                      p + o.ln_2_weight, p + o.ln_2_bias, BT, C, eps);
    matmul_forward(a.fc.data(), a.ln_2.data(), p + o.mlp_fc_weight, p + o.mlp_fc_bias, BT, C,
                   4 * C);
    gelu_forward(a.fc_gelu.data(), a.fc.data(), BT * 4 * C);
    matmul_forward(branch_out_.data(), a.fc_gelu.data(), p + o.mlp_proj_weight, p + o.mlp_proj_bias,
                   BT, 4 * C, C);
    residual_forward(residual_[l + 1].data(), a.residual_mid.data(), branch_out_.data(), BT * C);
  }

  hooks.before_head();
  layernorm_forward(ln_f_.data(), ln_f_mean_.data(), ln_f_rstd_.data(), residual_[L].data(),
                    params.final_norm + f.weight, params.final_norm + f.bias, BT, C, eps);
  matmul_forward(logits_.data(), ln_f_.data(), params.embeddings + e.wte, nullptr, BT, C, Vp);

  if (!batch.targets) {
    next_step_ = BackwardStep::kNeedsForwardWithTargets;
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::copy_n(batch.targets, BT, targets_.data());
  classifier_forward(losses_.data(), logsumexp_.data(), logits_.data(), targets_.data(), BT, V, Vp);
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += losses_[n];
  next_step_ = BackwardStep::kHead;
  return static_cast<float>(total / BT);
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

  // logits = ln_f wte^T, in chunks of positions so that dlogits never exists whole.
  zero(d_ln_, static_cast<size_t>(BT) * C);
  const int chunks = (BT + logits_chunk_rows_ - 1) / logits_chunk_rows_;
  const int rows_per_chunk = (BT + chunks - 1) / chunks;
  for (int first = 0; first < BT; first += rows_per_chunk) {
    const int rows = std::min(rows_per_chunk, BT - first);
    classifier_backward(d_logits_chunk_.data(), logits_.data() + static_cast<size_t>(first) * Vp,
                        logsumexp_.data() + first, targets_.data() + first, rows, V, Vp, dloss);
    matmul_backward(d_ln_.data() + static_cast<size_t>(first) * C, embeddings_grad + e.wte, nullptr,
                    d_logits_chunk_.data(), ln_f_.data() + static_cast<size_t>(first) * C,
                    params.embeddings + e.wte, rows, C, Vp);
  }

  zero(d_residual_, static_cast<size_t>(BT) * C);
  layernorm_backward(d_residual_.data(), final_norm_grad + f.weight, final_norm_grad + f.bias,
                     d_ln_.data(), residual_[config_.n_layer].data(), params.final_norm + f.weight,
                     ln_f_mean_.data(), ln_f_rstd_.data(), BT, C);
  next_step_ = BackwardStep::kBlock;
  next_layer_ = config_.n_layer - 1;
}

void CpuBackend::backward_block(int layer, const ParameterPointers& params, float* block_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kBlock && layer == next_layer_, "backward_block(", layer,
              ") is out of order: backward runs backward_head, then blocks ", config_.n_layer - 1,
              " down to 0, then backward_embeddings",
              next_step_ == BackwardStep::kBlock ? "; the next block is " : "",
              next_step_ == BackwardStep::kBlock ? std::to_string(next_layer_) : "");
  const int B = batch_, T = seq_len_, BT = B * T;
  const int C = config_.n_embd, NH = config_.n_head;
  const BlockOffsets& o = layout_.block();
  const float* p = params.blocks[layer];
  float* g = block_grad;
  const BlockActivations& a = blocks_[layer];

  std::fill_n(g, o.count, 0.0f);  // overwritten (ModelBackend); the ops below add into it

  // MLP branch. d_residual_ holds dL/d(block output) = dL/d(MLP output).
  zero(d_fc_gelu_, static_cast<size_t>(BT) * 4 * C);
  matmul_backward(d_fc_gelu_.data(), g + o.mlp_proj_weight, g + o.mlp_proj_bias, d_residual_.data(),
                  a.fc_gelu.data(), p + o.mlp_proj_weight, BT, 4 * C, C);
  zero(d_fc_, static_cast<size_t>(BT) * 4 * C);
  gelu_backward(d_fc_.data(), a.fc.data(), d_fc_gelu_.data(), BT * 4 * C);
  zero(d_ln_, static_cast<size_t>(BT) * C);
  matmul_backward(d_ln_.data(), g + o.mlp_fc_weight, g + o.mlp_fc_bias, d_fc_.data(), a.ln_2.data(),
                  p + o.mlp_fc_weight, BT, C, 4 * C);
  // Adding ln_2's input gradient turns d_residual_ into dL/d(residual_mid).
  layernorm_backward(d_residual_.data(), g + o.ln_2_weight, g + o.ln_2_bias, d_ln_.data(),
                     a.residual_mid.data(), p + o.ln_2_weight, a.ln_2_mean.data(),
                     a.ln_2_rstd.data(), BT, C);

  // Attention branch. d_residual_ holds dL/d(residual_mid) = dL/d(attention branch output).
  zero(d_att_out_, static_cast<size_t>(BT) * C);
  matmul_backward(d_att_out_.data(), g + o.attn_proj_weight, g + o.attn_proj_bias,
                  d_residual_.data(), a.att_out.data(), p + o.attn_proj_weight, BT, C, C);
  zero(d_qkv_, static_cast<size_t>(BT) * 3 * C);
  attention_backward(d_qkv_.data(), d_att_out_.data(), a.qkv.data(), a.att.data(), B, T, C, NH);
  zero(d_ln_, static_cast<size_t>(BT) * C);
  matmul_backward(d_ln_.data(), g + o.attn_qkv_weight, g + o.attn_qkv_bias, d_qkv_.data(),
                  a.ln_1.data(), p + o.attn_qkv_weight, BT, C, 3 * C);
  // Adding ln_1's input gradient turns d_residual_ into dL/d(block input).
  layernorm_backward(d_residual_.data(), g + o.ln_1_weight, g + o.ln_1_bias, d_ln_.data(),
                     residual_[layer].data(), p + o.ln_1_weight, a.ln_1_mean.data(),
                     a.ln_1_rstd.data(), BT, C);

  next_layer_ = layer - 1;
  if (layer == 0) next_step_ = BackwardStep::kEmbeddings;
}

void CpuBackend::backward_embeddings(const ParameterPointers& /*params*/, float* embeddings_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kEmbeddings,
              "backward_embeddings called before the backward of block 0");
  const EmbeddingOffsets& e = layout_.embeddings();
  embedding_backward(embeddings_grad + e.wte, embeddings_grad + e.wpe, d_residual_.data(),
                     inputs_.data(), batch_, seq_len_, config_.n_embd);
  // The forward's activations are intact, so the same backward may be run again.
  next_step_ = BackwardStep::kHead;
}

std::unique_ptr<ModelBackend> make_cpu_backend(const Gpt2Config& config, int max_batch,
                                               int max_seq_len) {
  return std::make_unique<CpuBackend>(config, max_batch, max_seq_len);
}

}  // namespace layup
