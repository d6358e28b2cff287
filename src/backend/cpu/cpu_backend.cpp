// The model graph (backend/model_graph.h) on the CPU ops: CpuOps below runs each of the graph's
// ops with the kernels in ops/, over the backend's arena. The kernels add into their outputs
// (ops/*.h); where the graph's op overwrites, CpuOps zeroes first. The LM head's backward goes in
// chunks of positions, so that the [B*T, Vp] gradient of the logits never exists whole.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "backend/cpu/ops/attention.h"
#include "backend/cpu/ops/attention_decode.h"
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

// The graph's ops (model_graph.h) for one batch of the backend's arena.
class CpuOps {
 public:
  CpuOps(const graph::Shape& shape, CpuBackendArena& arena) : s_(shape), arena_(arena) {}

  void embedding_forward(float* out, const float* wte, const float* wpe) {
    layup::embedding_forward(out, arena_.inputs, wte, wpe, s_.B, s_.T, s_.C);
  }
  void norm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                    const float* bias) {
    if (s_.norm == graph::Norm::kRmsNorm)
      rmsnorm_forward(out, rstd, x, weight, s_.rows, s_.C, s_.eps);
    else
      layernorm_forward(out, mean, rstd, x, weight, bias, s_.rows, s_.C, s_.eps);
  }
  template <class BeforeNorm>
  void residual_norm_forward(float* sum, float* out, float* mean, float* rstd, const float* x,
                             const float* branch, const float* weight, const float* bias,
                             BeforeNorm&& before_norm) {
    residual_forward(sum, x, branch);
    before_norm();
    norm_forward(out, mean, rstd, sum, weight, bias);
  }
  void residual_forward(float* sum, const float* x, const float* branch) {
    layup::residual_forward(sum, x, branch, s_.rows * s_.C);
  }
  void matmul_forward(float* out, const float* in, const float* weight, const float* bias,
                      int in_width, int out_width) {
    layup::matmul_forward(out, in, weight, bias, s_.rows, in_width, out_width);
  }
  void matmul_activation_forward(float* act, float* pre, const float* in, const float* weight,
                                 const float* bias, int in_width, int out_width) {
    matmul_forward(pre, in, weight, bias, in_width, out_width);
    activation_forward(act, pre);
  }
  void activation_forward(float* act, const float* pre) {
    if (s_.activation == graph::Activation::kSwiglu)
      swiglu_forward(act, pre, s_.rows, s_.act);
    else
      gelu_forward(act, pre, s_.rows * s_.act);
  }
  void rope_forward(float* qkv) {
    layup::rope_forward(qkv, qkv, arena_.rope_cos, arena_.rope_sin, s_.B, s_.T,
                        s_.heads + s_.kv_heads, s_.head_dim, s_.qkv);
  }
  void attention_forward(CpuBlockActivations& a) {
    grouped_query_attention_forward(a.att_out, a.att, a.qkv, s_.B, s_.T, s_.heads, s_.kv_heads,
                                    s_.head_dim);
  }

  void matmul_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                       const float* weight, int in_width, int out_width) {
    zero(din, static_cast<size_t>(s_.rows) * in_width);
    zero(dweight, static_cast<size_t>(out_width) * in_width);
    if (dbias) zero(dbias, out_width);
    layup::matmul_backward(din, dweight, dbias, dout, in, weight, s_.rows, in_width, out_width);
  }
  void matmul_activation_backward(float* d_pre, float* d_act, float* dweight, float* dbias,
                                  const float* dout, const float* act, const float* pre,
                                  const float* weight, int in_width, int out_width) {
    matmul_backward(d_act, dweight, dbias, dout, act, weight, in_width, out_width);
    zero(d_pre, static_cast<size_t>(s_.rows) * s_.fc);
    if (s_.activation == graph::Activation::kSwiglu)
      swiglu_backward(d_pre, d_act, pre, s_.rows, s_.act);
    else
      gelu_backward(d_pre, pre, d_act, s_.rows * s_.act);
  }
  void norm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* x,
                     const float* weight, const float* mean, const float* rstd) {
    zero(dweight, s_.C);
    if (s_.norm == graph::Norm::kRmsNorm) {
      rmsnorm_backward(din, dweight, dout, x, weight, rstd, s_.rows, s_.C);
    } else {
      zero(dbias, s_.C);
      layernorm_backward(din, dweight, dbias, dout, x, weight, mean, rstd, s_.rows, s_.C);
    }
  }
  void attention_backward(float* dqkv, const float* dout, const CpuBlockActivations& a) {
    zero(dqkv, static_cast<size_t>(s_.rows) * s_.qkv);
    grouped_query_attention_backward(dqkv, dout, a.qkv, a.att, s_.B, s_.T, s_.heads, s_.kv_heads,
                                     s_.head_dim);
  }
  void rope_backward(float* dqkv) {
    layup::rope_backward(dqkv, dqkv, arena_.rope_cos, arena_.rope_sin, s_.B, s_.T,
                         s_.heads + s_.kv_heads, s_.head_dim, s_.qkv);
  }
  void lm_head_backward(float* d_in, float* dweight, const float* logits, const float* logsumexp,
                        const int32_t* targets, const float* in, const float* weight, float dloss) {
    const int rows = s_.rows, C = s_.C, Vp = s_.Vp;
    zero(dweight, static_cast<size_t>(Vp) * C);
    zero(d_in, static_cast<size_t>(rows) * C);
    const int chunks = (rows + arena_.logits_chunk_rows - 1) / arena_.logits_chunk_rows;
    const int rows_per_chunk = (rows + chunks - 1) / chunks;
    for (int first = 0; first < rows; first += rows_per_chunk) {
      const int n = std::min(rows_per_chunk, rows - first);
      classifier_backward(arena_.d_logits_chunk, logits + static_cast<size_t>(first) * Vp,
                          logsumexp + first, targets + first, n, s_.V, Vp, dloss);
      layup::matmul_backward(d_in + static_cast<size_t>(first) * C, dweight, nullptr,
                             arena_.d_logits_chunk, in + static_cast<size_t>(first) * C, weight, n,
                             C, Vp);
    }
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout) {
    layup::embedding_backward(dwte, dwpe, dout, arena_.inputs, s_.B, s_.T, s_.C);
  }
  void zero(float* buffer, size_t count) { std::fill_n(buffer, count, 0.0f); }
  void zero_gradient(float* gradient, size_t count) { zero(gradient, count); }

 private:
  const graph::Shape& s_;
  CpuBackendArena& arena_;
};

// decode's view of the key/value cache, for a call whose new tokens start at position `first`.
struct CpuDecodeView {
  float *keys, *values;  // [L, max_positions, kv width]
  const float *rope_cos, *rope_sin;
  int max_positions, first;
};

// The graph's ops for generation (ModelBackend::decode): CpuOps', but for one sequence whose
// positions start at view.first, with attention over the cache.
class CpuDecodeOps : public CpuOps {
 public:
  CpuDecodeOps(const graph::Shape& shape, CpuBackendArena& arena, const CpuDecodeView& view)
      : CpuOps(shape, arena), s_(shape), arena_(arena), view_(view) {}

  void embedding_forward(float* out, const float* wte, const float* wpe) {
    layup::embedding_forward(out, arena_.inputs, wte,
                             wpe ? wpe + static_cast<size_t>(view_.first) * s_.C : nullptr, 1, s_.T,
                             s_.C);
  }
  void rope_forward(float* qkv) {
    const size_t offset = static_cast<size_t>(view_.first) * (s_.head_dim / 2);
    layup::rope_forward(qkv, qkv, view_.rope_cos + offset, view_.rope_sin + offset, 1, s_.T,
                        s_.heads + s_.kv_heads, s_.head_dim, s_.qkv);
  }
  void attention_forward(CpuBlockActivations& a) {
    const auto layer = static_cast<size_t>(&a - arena_.blocks.data());
    const size_t layer_offset =
        layer * view_.max_positions * static_cast<size_t>(s_.kv_heads) * s_.head_dim;
    attention_decode_forward(a.att_out, view_.keys + layer_offset, view_.values + layer_offset,
                             a.qkv, s_.T, view_.first, s_.heads, s_.kv_heads, s_.head_dim);
  }

 private:
  const graph::Shape& s_;
  CpuBackendArena& arena_;
  CpuDecodeView view_;
};

}  // namespace

CpuBackend::CpuBackend(const ModelConfig& config, int max_batch, int max_seq_len,
                       std::shared_ptr<MemoryAccountant> accountant)
    : config_(validated(config)),
      layout_(config),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      accountant_(accountant) {
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
  shape_ = graph::shape_of(config_, batch.batch, batch.seq_len);
  const int BT = shape_.rows;
  std::copy_n(batch.inputs, BT, arena_.inputs);
  order_.forward_started(/*layer_major=*/false);
  layer_major_started_ = false;
  CpuOps ops(shape_, arena_);
  graph::forward(ops, shape_, layout_, params, arena_, hooks);
  return loss_of(batch);
}

float CpuBackend::loss_of(const TokenBatch& batch) {
  if (!batch.targets) return std::numeric_limits<float>::quiet_NaN();
  const int BT = shape_.rows;
  std::copy_n(batch.targets, BT, arena_.targets);
  classifier_forward(arena_.losses, arena_.logsumexp, arena_.logits, arena_.targets, BT, shape_.V,
                     shape_.Vp);
  learned_targets_ = learned_target_count(batch.targets, BT);
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += arena_.losses[n];
  order_.loss_computed();
  return learned_targets_ > 0 ? static_cast<float>(total / learned_targets_) : 0.0f;
}

void CpuBackend::backward_head(const ParameterPointers& params, float* final_norm_grad,
                               float* embeddings_grad, float loss_scale) {
  order_.check_head(/*why_once=*/"");
  // d(mean loss) / d(loss of one learned position), scaled; 0 when none is learned
  const float dloss = learned_targets_ > 0 ? loss_scale / learned_targets_ : 0.0f;
  CpuOps ops(shape_, arena_);
  graph::backward_head(ops, shape_, layout_, params, arena_, final_norm_grad, embeddings_grad,
                       dloss);
  order_.head_done();
}

void CpuBackend::backward_block(int layer, const ParameterPointers& params, float* block_grad) {
  order_.check_block(layer);
  CpuOps ops(shape_, arena_);
  graph::backward_block(ops, shape_, layout_.block(), layer, params.blocks[layer], block_grad,
                        arena_, /*recompute=*/order_.resumed() ? 3 : 0,
                        /*last_kept=*/!order_.resumed());
  order_.block_done(layer);
}

void CpuBackend::backward_embeddings(const ParameterPointers& /*params*/, float* embeddings_grad) {
  order_.check_embeddings();
  CpuOps ops(shape_, arena_);
  graph::backward_embeddings(ops, layout_.embeddings(), arena_, embeddings_grad);
  order_.embeddings_done(/*repeatable=*/true);  // the forward's activations are intact
}

size_t CpuBackend::micro_batch_state_bytes() const {
  return layup::micro_batch_state_bytes(config_, max_batch_, max_seq_len_, sizeof(float));
}

void CpuBackend::park_micro_batch(void* store, bool with_inputs) {
  order_.check_park();
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(float));
  char* base = static_cast<char*>(store);
  const size_t activation = static_cast<size_t>(shape_.rows) * shape_.C;
  std::copy_n(arena_.d_residual, activation, reinterpret_cast<float*>(base + at.d_residual));
  if (!with_inputs) return;
  std::copy_n(arena_.inputs, shape_.rows, reinterpret_cast<int32_t*>(base + at.tokens));
  for (int layer = 0; layer < config_.n_layer; ++layer)
    std::copy_n(arena_.residual[layer], activation,
                reinterpret_cast<float*>(base + at.block_input(layer)));
}

void CpuBackend::resume_micro_batch(const void* store, int layer) {
  LAYUP_CHECK(!order_.awaits_forward() && layer >= -1 && layer < config_.n_layer,
              "resume_micro_batch(", layer,
              ") needs a forward first and a block of the model "
              "(or -1: the embeddings)");
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(float));
  const char* base = static_cast<const char*>(store);
  const size_t activation = static_cast<size_t>(shape_.rows) * shape_.C;
  std::copy_n(reinterpret_cast<const float*>(base + at.d_residual), activation, arena_.d_residual);
  if (layer >= 0) {
    std::copy_n(reinterpret_cast<const float*>(base + at.block_input(layer)), activation,
                arena_.residual[layer]);
  } else {
    std::copy_n(reinterpret_cast<const int32_t*>(base + at.tokens), shape_.rows, arena_.inputs);
  }
  order_.resumed_at(layer);
}

size_t CpuBackend::hidden_state_bytes() const {
  return layup::hidden_state_bytes(config_, max_batch_, max_seq_len_, sizeof(float));
}

void CpuBackend::forward_embeddings(const ParameterPointers& params, const TokenBatch& batch,
                                    void* hidden, void* store, ForwardHooks& hooks) {
  check_batch(params, batch);
  LAYUP_CHECK(batch.targets != nullptr,
              "a layer-major forward is a training step's: it needs "
              "targets");
  shape_ = graph::shape_of(config_, batch.batch, batch.seq_len);
  std::copy_n(batch.inputs, shape_.rows, arena_.inputs);
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(float));
  std::copy_n(batch.inputs, shape_.rows,
              reinterpret_cast<int32_t*>(static_cast<char*>(store) + at.tokens));
  order_.forward_started(/*layer_major=*/true);
  layer_major_started_ = true;
  CpuOps ops(shape_, arena_);
  graph::forward_embeddings(ops, layout_, params, static_cast<float*>(hidden), hooks);
}

void CpuBackend::forward_block(int layer, const ParameterPointers& params, void* hidden,
                               void* store, ForwardHooks& hooks) {
  LAYUP_CHECK(layer_major_started_ && layer >= 0 && layer < config_.n_layer, "forward_block(",
              layer, ") needs forward_embeddings first and a block of the model");
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(float));
  auto* x = static_cast<float*>(hidden);
  std::copy_n(x, static_cast<size_t>(shape_.rows) * shape_.C,
              reinterpret_cast<float*>(static_cast<char*>(store) + at.block_input(layer)));
  CpuOps ops(shape_, arena_);
  graph::forward_block(ops, shape_, layout_.block(), layer, params.blocks[layer], arena_,
                       static_cast<const float*>(x), x, hooks);
}

float CpuBackend::forward_head(const ParameterPointers& params, const TokenBatch& batch,
                               const void* hidden, ForwardHooks& hooks) {
  LAYUP_CHECK(layer_major_started_ && batch.targets != nullptr && batch.batch == shape_.B &&
                  batch.seq_len == shape_.T,
              "forward_head needs forward_embeddings and the blocks of the same batch first, "
              "with targets");
  std::copy_n(static_cast<const float*>(hidden), static_cast<size_t>(shape_.rows) * shape_.C,
              arena_.residual[config_.n_layer]);
  CpuOps ops(shape_, arena_);
  graph::forward_head(ops, shape_, layout_, params, arena_, hooks);
  return loss_of(batch);
}

void CpuBackend::start_decode(int max_positions) {
  LAYUP_CHECK(max_positions >= 1, "a key/value cache needs room for a position at least");
  check_sequence_length(config_, max_positions);
  DecodeCache& cache = decode_cache_;
  cache.length = 0;
  if (cache.max_positions == max_positions) return;
  cache = DecodeCache();
  const size_t bytes = kv_cache_bytes(config_, max_positions, sizeof(float));
  cache.keys.assign(bytes / sizeof(float) / 2, 0.0f);
  cache.values.assign(bytes / sizeof(float) / 2, 0.0f);
  cache.record = MemoryRecord(accountant_, MemorySide::kDevice, TensorClass::kActivations,
                              MemoryKind::kHost, bytes);
  if (config_.is_llama()) {
    const int half = config_.head_dim() / 2;
    std::vector<float> inv_freq(half);
    rope_inverse_frequencies(inv_freq.data(), config_.head_dim(), config_.rope_theta,
                             config_.rope_scaling);
    cache.rope_cos.resize(static_cast<size_t>(max_positions) * half);
    cache.rope_sin.resize(cache.rope_cos.size());
    rope_cos_sin(cache.rope_cos.data(), cache.rope_sin.data(), inv_freq.data(), max_positions,
                 config_.head_dim());
  }
  cache.max_positions = max_positions;
}

const float* CpuBackend::decode(const ParameterPointers& params, std::span<const int32_t> tokens) {
  DecodeCache& cache = decode_cache_;
  LAYUP_CHECK(cache.max_positions > 0, "decode needs start_decode first");
  const int count = static_cast<int>(tokens.size());
  LAYUP_CHECK(cache.length + count <= cache.max_positions, "the key/value cache holds ",
              cache.max_positions, " positions and has ", cache.length, " in it; ", count,
              " more do not fit");
  const TokenBatch batch{tokens.data(), nullptr, 1, count};
  check_batch(params, batch);
  order_.forward_started(/*layer_major=*/false);
  layer_major_started_ = false;
  shape_ = graph::shape_of(config_, 1, count);
  std::copy_n(tokens.data(), count, arena_.inputs);
  CpuDecodeOps ops(shape_, arena_,
                   {cache.keys.data(), cache.values.data(), cache.rope_cos.data(),
                    cache.rope_sin.data(), cache.max_positions, cache.length});
  struct NoHooks final : ForwardHooks {};
  NoHooks hooks;
  graph::forward(ops, shape_, layout_, params, arena_, hooks);
  cache.length += count;
  return arena_.logits + static_cast<size_t>(count - 1) * shape_.Vp;
}

std::unique_ptr<ModelBackend> make_cpu_backend(const ModelConfig& config, int max_batch,
                                               int max_seq_len,
                                               std::shared_ptr<MemoryAccountant> accountant) {
  return std::make_unique<CpuBackend>(config, max_batch, max_seq_len, std::move(accountant));
}

}  // namespace layup
