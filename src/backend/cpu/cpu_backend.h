// The fp32 CPU backend: GPT-2's and the Llama family's forward and block-wise backward, the model
// graph (backend/model_graph.h) run on the ops in ops/, OpenMP-parallel.
//
// It is the reference every other backend is compared with, and the "device" the schedules drive
// in CI. It owns every activation the backward needs, sized once for max_batch x max_seq_len, and
// the gradient of the residual stream between backward calls, in the two regions that
// cpu_backend_buffers lists. Weights and weight gradients are
// never owned here: each call is handed the spans it reads and the memory it writes the gradient
// into (ModelBackend says which calls overwrite and which add).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backward_order.h"
#include "backend/cpu/cpu_backend_buffers.h"
#include "backend/model_backend.h"
#include "backend/model_graph.h"
#include "memory/memory_accountant.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup {

class CpuBackend final : public ModelBackend {
 public:
  // Records its memory in `accountant` while it lives (null: records nowhere).
  CpuBackend(const ModelConfig& config, int max_batch, int max_seq_len,
             std::shared_ptr<MemoryAccountant> accountant = nullptr);

  std::string name() const override { return "cpu"; }
  using ModelBackend::forward;  // the no-hooks form
  float forward(const ParameterPointers& params, const TokenBatch& batch,
                ForwardHooks& hooks) override;
  // Valid until the next forward (the backward leaves the logits intact).
  const float* logits() const override { return arena_.logits; }
  void backward_head(const ParameterPointers& params, float* final_norm_grad,
                     float* embeddings_grad, float loss_scale) override;
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override;
  void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) override;
  size_t micro_batch_state_bytes() const override;
  void park_micro_batch(void* store, bool with_inputs) override;
  void resume_micro_batch(const void* store, int layer) override;
  // The layer-major forward's hidden states are fp32 in host memory, the CPU's "device" memory.
  size_t hidden_state_bytes() const override;
  void forward_embeddings(const ParameterPointers& params, const TokenBatch& batch, void* hidden,
                          void* store, ForwardHooks& hooks) override;
  void forward_block(int layer, const ParameterPointers& params, void* hidden, void* store,
                     ForwardHooks& hooks) override;
  float forward_head(const ParameterPointers& params, const TokenBatch& batch, const void* hidden,
                     ForwardHooks& hooks) override;
  void start_decode(int max_positions) override;
  const float* decode(const ParameterPointers& params, std::span<const int32_t> tokens) override;
  int decoded_positions() const override { return decode_cache_.length; }

 private:
  void check_batch(const ParameterPointers& params, const TokenBatch& batch) const;
  // The mean loss of the logits against batch.targets (forward's and forward_head's), and the
  // backward's state after it.
  float loss_of(const TokenBatch& batch);

  ModelConfig config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_len_;

  // The last forward's sizes.
  graph::Shape shape_;

  // The two regions of cpu_backend_buffers (activations, scratch), their records in the
  // accountant, and where each buffer lies inside them.
  struct AlignedDelete {
    void operator()(char* data) const;
  };
  std::unique_ptr<char, AlignedDelete> activations_region_, scratch_region_;
  std::vector<MemoryRecord> records_;
  CpuBackendArena arena_;

  // decode's key/value cache: [L, max_positions, kv_heads * head_dim] keys and values, and the
  // rotary table of its positions (the arena's covers max_seq_len positions only).
  struct DecodeCache {
    int max_positions = 0, length = 0;
    std::vector<float> keys, values, rope_cos, rope_sin;
    MemoryRecord record;
  };
  DecodeCache decode_cache_;
  std::shared_ptr<MemoryAccountant> accountant_;

  BackwardOrder order_{config_.n_layer};
  int learned_targets_ = 0;  // of the last forward: the divisor of its mean loss
  // forward_embeddings has run since the last forward or decode: the blocks may follow.
  bool layer_major_started_ = false;
};

}  // namespace layup
