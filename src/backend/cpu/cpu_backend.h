// The fp32 CPU backend: GPT-2 forward and block-wise backward on the ops in ops/, OpenMP-parallel.
//
// It is the reference every other backend is compared with, and the "device" the schedules drive
// in CI. It owns every activation the backward needs, sized once for max_batch x max_seq_len, and
// the gradient of the residual stream between backward calls. Weights and weight gradients are
// never owned here: each call is handed the spans it reads and the memory it writes the gradient
// into (ModelBackend says which calls overwrite and which add).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/model_backend.h"
#include "model/gpt2_config.h"
#include "model/parameter_layout.h"

namespace layup {

class CpuBackend final : public ModelBackend {
 public:
  CpuBackend(const Gpt2Config& config, int max_batch, int max_seq_len);

  std::string name() const override { return "cpu"; }
  using ModelBackend::forward;  // the no-hooks form
  float forward(const ParameterPointers& params, const TokenBatch& batch,
                ForwardHooks& hooks) override;
  // Valid until the next forward (the backward leaves the logits intact).
  const float* logits() const override { return logits_.data(); }
  void backward_head(const ParameterPointers& params, float* final_norm_grad,
                     float* embeddings_grad, float loss_scale) override;
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override;
  void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) override;

 private:
  // What one transformer block saves in its forward for its backward. Rows are the B*T positions.
  struct BlockActivations {
    std::vector<float> ln_1, ln_1_mean, ln_1_rstd;  // [BT,C], [BT], [BT]
    std::vector<float> qkv;                         // [BT,3C]
    std::vector<float> att;                         // [B,NH,T,T] softmax probabilities
    std::vector<float> att_out;                     // [BT,C] heads merged, before c_proj
    std::vector<float> residual_mid;                // [BT,C] x + attention branch
    std::vector<float> ln_2, ln_2_mean, ln_2_rstd;  // [BT,C], [BT], [BT]
    std::vector<float> fc;                          // [BT,4C] before GELU
    std::vector<float> fc_gelu;                     // [BT,4C] after GELU
  };

  // Which backward call is legal next; backward runs head, blocks L-1..0, embeddings.
  enum class BackwardStep { kNeedsForwardWithTargets, kHead, kBlock, kEmbeddings };

  void check_batch(const ParameterPointers& params, const TokenBatch& batch) const;

  Gpt2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_len_;
  int logits_chunk_rows_;  // rows of dlogits the head's backward materializes at a time

  // The last forward's batch.
  int batch_ = 0, seq_len_ = 0;
  std::vector<int32_t> inputs_, targets_;

  // Forward activations. residual_[l] is block l's input; residual_[L] is the input of ln_f.
  std::vector<std::vector<float>> residual_;
  std::vector<BlockActivations> blocks_;
  std::vector<float> ln_f_, ln_f_mean_, ln_f_rstd_;  // [BT,C], [BT], [BT]
  std::vector<float> logits_;                        // [BT,Vp]
  std::vector<float> losses_;                        // [BT]
  std::vector<float> logsumexp_;                     // [BT] of the real-vocabulary logits
  std::vector<float> branch_out_;  // [BT,C] scratch: a branch before its residual add

  // Backward state: d_residual_ is dL/d(residual stream) at the point backward has reached; the
  // rest are scratch gradients of one block's intermediates.
  std::vector<float> d_residual_;      // [BT,C]
  std::vector<float> d_ln_;            // [BT,C] gradient of a layer norm's output
  std::vector<float> d_att_out_;       // [BT,C]
  std::vector<float> d_qkv_;           // [BT,3C]
  std::vector<float> d_fc_gelu_;       // [BT,4C]
  std::vector<float> d_fc_;            // [BT,4C]
  std::vector<float> d_logits_chunk_;  // [logits_chunk_rows_, Vp]

  BackwardStep next_step_ = BackwardStep::kNeedsForwardWithTargets;
  int next_layer_ = -1;
};

}  // namespace layup
