// The interface every backend (CPU, CUDA) offers to the schedules: the model's forward pass
// (GPT-2 or the Llama family, model_config.h), and its backward pass cut at block boundaries.
//
// Backward is split so that a schedule can decide, block by block, where each gradient goes:
// the whole-model gradient buffer (gpu mode), or one of two gradient slots handed to CPU workers
// (layup mode). The order a schedule must call is the order of backpropagation:
//
//   forward(params, batch)                     loss of the batch
//   backward_head(params, grads...)            classifier + final norm
//   backward_block(L-1 ... 0, params, slot)    each transformer block
//   backward_embeddings(params, grads)         token and position embeddings
//
// Gradient memory: backward_head OVERWRITES the final norm's span's gradient (an untied LM head's
// included) and the whole embeddings span's (wte with a tied LM head's part, else zeros, wpe with
// zeros); backward_block OVERWRITES its block's;
// backward_embeddings ADDS the input embedding's part to the span the head wrote (the tied token
// embedding receives gradient from the head first and from the input embedding last). So one
// backward pass leaves one micro-batch's complete gradient in the memory it was given, which
// nobody has to zero first; summing micro-batches is the schedule's (in one fixed order, see
// docs/schedules.md, "Micro-batch accumulation").
//
// Forward hooks: a schedule whose weight updates may still be landing when the next forward
// starts passes ForwardHooks, called right before the first read of each span's weights
// (docs/schedules.md, "What a step may leave in flight").
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "model/model_config.h"
#include "model/parameter_layout.h"
#include "model/token_batch.h"

namespace layup {

class MemoryAccountant;  // memory/memory_accountant.h

using ParameterPointers = SpanPointers<const float>;
using GradientPointers = SpanPointers<float>;

// What a forward calls, in this order and once each: before_embeddings() before its first read of
// the embeddings span (wte, wpe: the token embedding, the first op), before_block(l) before its
// first read of block l's span, for l = 0 .. L-1, and before_head() before its first read of the
// final-norm span (the LM head reads wte too: it is covered by before_embeddings). A hook may
// block (wait for an update) or throw (the forward then throws). When the backend's reads are
// asynchronous (CUDA), "read" means "work that reads it is enqueued".
class ForwardHooks {
 public:
  virtual void before_embeddings() {}
  virtual void before_block(int /*layer*/) {}
  virtual void before_head() {}

 protected:
  ~ForwardHooks() = default;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  virtual std::string name() const = 0;

  // Runs the forward pass, calling `hooks` as ForwardHooks says (each right before the span's
  // weights are first read). With targets it returns the mean cross-entropy over the learned
  // positions (target >= 0; all B*T positions when every target is learned; 0 when none is), the
  // padded-vocabulary logits excluded; without targets, it returns NaN. B and T must not
  // exceed the sizes the backend was made for.
  virtual float forward(const ParameterPointers& params, const TokenBatch& batch,
                        ForwardHooks& hooks) = 0;

  // The backend's bf16 compute copy of span `index`'s weights (device memory laid out like the
  // span) where it keeps one (the CUDA backend in bf16), else null. A schedule that updates the
  // master weights on the device can write the copy in the same pass (Device::adamw_update_span)
  // and then call set_compute_copies_current(true): forwards read the copies as they are instead
  // of casting the master weights again, until set_compute_copies_current(false), which a
  // schedule must call before it changes the master weights in any other way. By default (false)
  // every forward casts.
  virtual void* compute_copy(size_t /*span_index*/) { return nullptr; }
  // Makes span `span_index`'s compute copy `bf16` (device memory laid out like the span, owned by
  // the caller: a streamed block's ring slot, schedule/weight_ring.h) from now on: forward,
  // backward and compute_copy read it there. Returns false where the backend keeps no compute
  // copy.
  virtual bool place_compute_copy(size_t /*span_index*/, void* /*bf16*/) { return false; }
  virtual void set_compute_copies_current(bool /*current*/) {}

  // The same forward with hooks that do nothing.
  float forward(const ParameterPointers& params, const TokenBatch& batch);

  // Logits of the last forward: [B, T, padded_vocab] row-major, in host memory. Entries at and
  // beyond the real vocabulary are the padded logits and carry no meaning.
  virtual const float* logits() const = 0;

  // Backward of the loss through the classifier (tied LM head) and the final layer norm.
  // loss_scale multiplies d(loss): 1 for one batch, 1/N when accumulating N micro-batches.
  // Overwrites final_norm_grad (the final-norm span) and embeddings_grad (the embeddings span:
  // the head's part of wte, zeros for wpe).
  virtual void backward_head(const ParameterPointers& params, float* final_norm_grad,
                             float* embeddings_grad, float loss_scale) = 0;

  // Backward of one transformer block; overwrites block_grad, which is laid out like one
  // block span (BlockOffsets). Blocks must be called from the last to the first.
  virtual void backward_block(int layer, const ParameterPointers& params, float* block_grad) = 0;

  // Backward of the token and position embeddings; adds into embeddings_grad, which
  // backward_head wrote.
  virtual void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) = 0;

  // Layer-major accumulation (docs/schedules.md, "Micro-batch accumulation") runs block l's
  // backward of every micro-batch before block l-1's, and the backend keeps one micro-batch's
  // activations. Between its backward calls a micro-batch waits in a store of the schedule's
  // (micro_batch_state_bytes() bytes of memory the backend's copies reach, aligned as a float
  // buffer): its tokens, every block's input (what each block's forward is computed again from)
  // and the residual stream's gradient where its backward has reached. In each micro-batch's order:
  //   forward, backward_head, park_micro_batch(store, /*with_inputs=*/true)
  //   resume_micro_batch(store, l), backward_block(l), park_micro_batch(store, false)  l = L-1..0
  //   resume_micro_batch(store, -1), backward_embeddings
  // A backward_block after resume_micro_batch computes the block's forward again from its input
  // first (the last block's too), bit for bit what the forward computed. Every micro-batch of
  // one interleaved backward has the same B and T. The base refuses.
  virtual size_t micro_batch_state_bytes() const;
  virtual void park_micro_batch(void* store, bool with_inputs);
  virtual void resume_micro_batch(const void* store, int layer);

  // The layer-major forward (docs/schedules.md, "Layer-major"): forward cut at block boundaries,
  // so that block l's forward of every micro-batch runs before block l+1's and the forward reads
  // each block's weights once a step. Between the calls a micro-batch's residual stream waits in
  // a hidden state of the caller's (hidden_state_bytes(): [B*T, C] activations, in memory the
  // backend computes on, the device's own), and each block's input goes into the micro-batch's
  // store as the block reads it. In each micro-batch's order, the hooks as forward calls them:
  //   forward_embeddings(params, batch, hidden, store, hooks)   x_0 into hidden, the tokens into
  //                                                             the store
  //   forward_block(l, params, hidden, store, hooks)            x_l into the store, x_l+1 into
  //                                                             hidden, l = 0 .. L-1
  //   forward_head(params, batch, hidden, hooks)                forward's loss of x_L
  //   backward_head, park_micro_batch(store, /*with_inputs=*/false), then the backward above
  // The values are forward's (model_graph.h, forward_block), and the backward after it goes
  // through the stores (resume_micro_batch first). Every micro-batch has one B and T. The base
  // refuses.
  virtual size_t hidden_state_bytes() const;
  virtual void forward_embeddings(const ParameterPointers& params, const TokenBatch& batch,
                                  void* hidden, void* store, ForwardHooks& hooks);
  virtual void forward_block(int layer, const ParameterPointers& params, void* hidden, void* store,
                             ForwardHooks& hooks);
  virtual float forward_head(const ParameterPointers& params, const TokenBatch& batch,
                             const void* hidden, ForwardHooks& hooks);

  // Generation with a key/value cache (layup sample), one sequence at a time. start_decode empties
  // the cache and makes room for `max_positions` positions (the model's context at most), taking
  // kv_cache_bytes of memory while the backend lives. decode runs the forward of `tokens` at the
  // next positions: each attends to the cached keys and values of every earlier position and to
  // the new tokens before it, then its own join the cache; it returns the logits of the last one
  // ([padded_vocab], host memory, valid until the next forward or decode). A call takes at most
  // max_batch x max_seq_len tokens (a longer prompt goes in pieces), and the cache must have
  // room for them (layup::Error otherwise). The logits are forward's on the same positions up to
  // float rounding: the attention sums run in another order. A decode leaves nothing for a
  // backward. The base has no cache and refuses.
  virtual void start_decode(int max_positions);
  virtual const float* decode(const ParameterPointers& params, std::span<const int32_t> tokens);
  // Positions the cache holds now.
  virtual int decoded_positions() const { return 0; }
};

// Bytes of a key/value cache of `positions` positions for one sequence, elements of
// `element_bytes` each (4: fp32, 2: bf16): every block's keys and values, kv_heads x head_dim
// each per position.
size_t kv_cache_bytes(const ModelConfig& config, int positions, size_t element_bytes);

// Bytes of one micro-batch's store (ModelBackend::micro_batch_state_bytes) at B x T, activations
// of `element_bytes` each (4: fp32, 2: bf16): the residual stream's gradient and every block's
// input, L + 1 of [B*T, C], after the tokens and the embedding backward's grouping of them.
size_t micro_batch_state_bytes(const ModelConfig& config, int batch, int seq_len,
                               size_t element_bytes);

// Bytes of one micro-batch's hidden state (ModelBackend::hidden_state_bytes) at B x T: [B*T, C]
// activations of `element_bytes` each, whole cache lines.
size_t hidden_state_bytes(const ModelConfig& config, int batch, int seq_len, size_t element_bytes);

// Where each part of such a store lies, in bytes from its start, for B x T at most.
struct MicroBatchStoreLayout {
  size_t tokens = 0;      // int32 [4 B*T + 1]: the tokens, then what a backend derives from them
  size_t d_residual = 0;  // [B*T, C] elements
  size_t residual = 0;    // L of [B*T, C] elements, `stride` bytes apart: the blocks' inputs
  size_t stride = 0;
  size_t bytes = 0;

  size_t block_input(int layer) const { return residual + static_cast<size_t>(layer) * stride; }
};
MicroBatchStoreLayout micro_batch_store_layout(const ModelConfig& config, int batch, int seq_len,
                                               size_t element_bytes);

// The checks every backend makes on a forward's inputs: parameters for every block, B and T within
// the sizes the backend was made for, every token id inside the vocabulary. Throws layup::Error
// naming the backend (e.g. "CPU") and the offending value.
void check_token_batch(const char* backend_name, const ModelConfig& config, int max_batch,
                       int max_seq_len, const ParameterPointers& params, const TokenBatch& batch);

// The fp32 CPU backend (OpenMP), sized for batches up to max_batch x max_seq_len. Records its
// memory (backend/cpu/cpu_backend_buffers.h) in `accountant` while it lives (null: nowhere).
std::unique_ptr<ModelBackend> make_cpu_backend(
    const ModelConfig& config, int max_batch, int max_seq_len,
    std::shared_ptr<MemoryAccountant> accountant = nullptr);

}  // namespace layup
