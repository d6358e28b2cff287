// Checks shared by every backend, and the default (wait-for-everything) hooked forward.
#include "backend/model_backend.h"

#include "core/error.h"

namespace layup {

float ModelBackend::forward(const ParameterPointers& params, const TokenBatch& batch) {
  struct NoHooks final : ForwardHooks {};
  NoHooks no_hooks;
  return forward(params, batch, no_hooks);
}

void ModelBackend::start_decode(int /*max_positions*/) {
  fail("the ", name(), " backend has no key/value cache; sample with --no-kv-cache");
}

const float* ModelBackend::decode(const ParameterPointers& /*params*/,
                                  std::span<const int32_t> /*tokens*/) {
  fail("the ", name(), " backend has no key/value cache; sample with --no-kv-cache");
}

size_t ModelBackend::micro_batch_state_bytes() const {
  fail("the ", name(),
       " backend cannot interleave micro-batches; use --accumulate "
       "micro-batch-major");
}
void ModelBackend::park_micro_batch(void* /*store*/, bool /*with_inputs*/) {
  fail("the ", name(),
       " backend cannot interleave micro-batches; use --accumulate "
       "micro-batch-major");
}
void ModelBackend::resume_micro_batch(const void* /*store*/, int /*layer*/) {
  fail("the ", name(),
       " backend cannot interleave micro-batches; use --accumulate "
       "micro-batch-major");
}

size_t ModelBackend::hidden_state_bytes() const {
  fail("the ", name(), " backend has no layer-major forward; use --accumulate micro-batch-major");
}
void ModelBackend::forward_embeddings(const ParameterPointers& /*params*/,
                                      const TokenBatch& /*batch*/, void* /*hidden*/,
                                      void* /*store*/, ForwardHooks& /*hooks*/) {
  fail("the ", name(), " backend has no layer-major forward; use --accumulate micro-batch-major");
}
void ModelBackend::forward_block(int /*layer*/, const ParameterPointers& /*params*/,
                                 void* /*hidden*/, void* /*store*/, ForwardHooks& /*hooks*/) {
  fail("the ", name(), " backend has no layer-major forward; use --accumulate micro-batch-major");
}
float ModelBackend::forward_head(const ParameterPointers& /*params*/, const TokenBatch& /*batch*/,
                                 const void* /*hidden*/, ForwardHooks& /*hooks*/) {
  fail("the ", name(), " backend has no layer-major forward; use --accumulate micro-batch-major");
}

namespace {
// Every part of a store, and a hidden state, starts on 64 bytes: whole cache lines, aligned vector
// loads.
size_t cache_lines(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}
}  // namespace

size_t hidden_state_bytes(const ModelConfig& config, int batch, int seq_len, size_t element_bytes) {
  return cache_lines(static_cast<size_t>(batch) * seq_len * config.n_embd * element_bytes);
}

MicroBatchStoreLayout micro_batch_store_layout(const ModelConfig& config, int batch, int seq_len,
                                               size_t element_bytes) {
  const size_t rows = static_cast<size_t>(batch) * seq_len;
  const size_t activation = hidden_state_bytes(config, batch, seq_len, element_bytes);
  MicroBatchStoreLayout layout;
  layout.tokens = 0;
  layout.d_residual = cache_lines((4 * rows + 1) * sizeof(int32_t));
  layout.residual = layout.d_residual + activation;
  layout.stride = activation;
  layout.bytes = layout.residual + static_cast<size_t>(config.n_layer) * activation;
  return layout;
}

size_t micro_batch_state_bytes(const ModelConfig& config, int batch, int seq_len,
                               size_t element_bytes) {
  return micro_batch_store_layout(config, batch, seq_len, element_bytes).bytes;
}

size_t kv_cache_bytes(const ModelConfig& config, int positions, size_t element_bytes) {
  return 2 * static_cast<size_t>(config.n_layer) * positions * config.kv_heads() *
         config.head_dim() * element_bytes;
}

void check_token_batch(const char* backend_name, const ModelConfig& config, int max_batch,
                       int max_seq_len, const ParameterPointers& params, const TokenBatch& batch) {
  LAYUP_CHECK(params.embeddings && params.final_norm &&
                  static_cast<int>(params.blocks.size()) == config.n_layer,
              "the ", backend_name, " backend was given parameters for ", params.blocks.size(),
              " blocks; the model has ", config.n_layer);
  LAYUP_CHECK(batch.inputs != nullptr, "the batch has no input tokens");
  LAYUP_CHECK(batch.batch >= 1 && batch.batch <= max_batch, "batch of ", batch.batch,
              " sequences does not fit the ", backend_name, " backend, which was made for 1..",
              max_batch);
  LAYUP_CHECK(batch.seq_len >= 1 && batch.seq_len <= max_seq_len, "sequence length ", batch.seq_len,
              " does not fit the ", backend_name, " backend, which was made for 1..", max_seq_len,
              " (the model's context is ", config.n_positions, ")");
  const int count = batch.batch * batch.seq_len;
  for (int i = 0; i < count; ++i) {
    LAYUP_CHECK(batch.inputs[i] >= 0 && batch.inputs[i] < config.vocab_size, "input token ",
                batch.inputs[i], " at position ", i, " is outside the vocabulary 0..",
                config.vocab_size - 1);
    // A target below 0 is not learned (TokenBatch).
    LAYUP_CHECK(!batch.targets || batch.targets[i] < config.vocab_size, "target token ",
                batch.targets[i], " at position ", i, " is outside the vocabulary 0..",
                config.vocab_size - 1);
  }
}

}  // namespace layup
