// A ModelBackend that forwards every call to another: the base of the schedule tests' wrappers,
// which override only what they delay or watch, so a ModelBackend call added later reaches the
// inner backend (as ForwardingDevice does for the Device).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "backend/model_backend.h"

namespace layup {

class ForwardingBackend : public ModelBackend {
 public:
  explicit ForwardingBackend(std::unique_ptr<ModelBackend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  float forward(const ParameterPointers& params, const TokenBatch& batch,
                ForwardHooks& hooks) override {
    return inner_->forward(params, batch, hooks);
  }
  void* compute_copy(size_t span_index) override { return inner_->compute_copy(span_index); }
  bool place_compute_copy(size_t span_index, void* bf16) override {
    return inner_->place_compute_copy(span_index, bf16);
  }
  void set_compute_copies_current(bool current) override {
    inner_->set_compute_copies_current(current);
  }
  const float* logits() const override { return inner_->logits(); }
  void backward_head(const ParameterPointers& params, float* final_norm_grad,
                     float* embeddings_grad, float loss_scale) override {
    inner_->backward_head(params, final_norm_grad, embeddings_grad, loss_scale);
  }
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override {
    inner_->backward_block(layer, params, block_grad);
  }
  void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) override {
    inner_->backward_embeddings(params, embeddings_grad);
  }
  size_t micro_batch_state_bytes() const override { return inner_->micro_batch_state_bytes(); }
  void park_micro_batch(void* store, bool with_inputs) override {
    inner_->park_micro_batch(store, with_inputs);
  }
  void resume_micro_batch(const void* store, int layer) override {
    inner_->resume_micro_batch(store, layer);
  }
  size_t hidden_state_bytes() const override { return inner_->hidden_state_bytes(); }
  void forward_embeddings(const ParameterPointers& params, const TokenBatch& batch, void* hidden,
                          void* store, ForwardHooks& hooks) override {
    inner_->forward_embeddings(params, batch, hidden, store, hooks);
  }
  void forward_block(int layer, const ParameterPointers& params, void* hidden, void* store,
                     ForwardHooks& hooks) override {
    inner_->forward_block(layer, params, hidden, store, hooks);
  }
  float forward_head(const ParameterPointers& params, const TokenBatch& batch, const void* hidden,
                     ForwardHooks& hooks) override {
    return inner_->forward_head(params, batch, hidden, hooks);
  }
  void start_decode(int max_positions) override { inner_->start_decode(max_positions); }
  const float* decode(const ParameterPointers& params, std::span<const int32_t> tokens) override {
    return inner_->decode(params, tokens);
  }
  int decoded_positions() const override { return inner_->decoded_positions(); }

 protected:
  ModelBackend& inner() const { return *inner_; }

 private:
  std::unique_ptr<ModelBackend> inner_;
};

}  // namespace layup
