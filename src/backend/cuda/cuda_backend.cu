// GPT-2 on the CUDA ops: the pre-LN block, the tied LM head, and backward cut at block boundaries.
// The same model and the same sequence of ops as backend/cpu/cpu_backend.cpp:
//
//   x_0 = wte[tokens] + wpe[0:T]
//   block l:  mid = x + c_proj(attention(c_attn(ln_1(x))))
//             x'  = mid + mlp_proj(gelu(mlp_fc(ln_2(mid))))
//   logits = ln_f(x_L) wte^T          (over the padded vocabulary; padded wte rows are zero)
//   loss   = mean over positions of the cross-entropy over the real vocabulary
//
// As on the CPU, a residual add passes its gradient to both summands unchanged, so d_residual
// serves as the gradient of a block's output and of its branches' outputs at once, and each layer
// norm's input gradient is accumulated into it.
//
// Everything runs on one blocking stream (see cuda_device.h for why blocking). The backend's memory
// is what cuda_backend_buffers lists (cuda_backend_buffers.h), allocated as listed: three regions,
// one per tensor class (the bf16 compute copy of the weights, always in device memory; the
// activations; the scratch of the backward), each of the kind the placement gives it (--place
// activations=..., scratch=...) and cut into 256-byte aligned pieces by cuda_arena.h's carve();
// cuBLASLt's workspace; the pinned staging. cuDNN's workspace grows when cuDNN asks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/growable_workspace.h"
#include "backend/cuda/ops/attention.cuh"
#include "backend/cuda/ops/attention_cudnn.cuh"
#include "backend/cuda/ops/cast.cuh"
#include "backend/cuda/ops/classifier.cuh"
#include "backend/cuda/ops/common.cuh"
#include "backend/cuda/ops/embedding.cuh"
#include "backend/cuda/ops/gelu.cuh"
#include "backend/cuda/ops/layernorm.cuh"
#include "backend/cuda/ops/matmul.cuh"
#include "backend/cuda/ops/residual.cuh"
#include "backend/cuda/ops/rmsnorm.cuh"
#include "backend/cuda/ops/rope.cuh"
#include "backend/cuda/ops/swiglu.cuh"
#include "core/error.h"
#include "memory/memory_accountant.h"
#include "model/parameter_layout.h"
#include "model/rope_tables.h"

namespace layup {
namespace {

// A tensor of the span at `base`, or null where the model has none (kAbsent).
template <class T>
T* tensor_at(T* base, size_t offset) {
  return offset == kAbsent ? nullptr : base + offset;
}

template <class T>
class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(const ModelConfig& config, int max_batch, int max_seq_len, int recompute,
              std::shared_ptr<MemoryAccountant> accountant, const CudaArenaKinds& kinds,
              AlgorithmChoice algorithms, AttentionChoice attention);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override {
    return std::string("cuda-") + (std::is_same_v<T, float> ? "fp32" : "bf16");
  }
  using ModelBackend::forward;  // the no-hooks form
  float forward(const ParameterPointers& params, const TokenBatch& batch,
                ForwardHooks& hooks) override;
  const float* logits() const override;
  void backward_head(const ParameterPointers& params, float* final_norm_grad,
                     float* embeddings_grad, float loss_scale) override;
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override;
  void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) override;
  void* compute_copy(size_t span_index) override {
    if constexpr (std::is_same_v<T, float>)
      return nullptr;
    else
      return arena_.compute_weights + shape_.compute_span_offsets.at(span_index);
  }
  void set_compute_copies_current(bool current) override { compute_copies_current_ = current; }

 private:
  using BlockActivations = typename CudaArena<T>::BlockActivations;

  enum class BackwardStep { kNeedsForwardWithTargets, kHead, kBlock, kEmbeddings };

  void check_batch(const ParameterPointers& params, const TokenBatch& batch) const;
  // The weights the kernels read: the fp32 spans themselves, or their bf16 compute copy.
  SpanPointers<const T> weights(const ParameterPointers& params) const;
  // bf16 mode: casts span `index` (layout order) of the fp32 weights into the compute copy,
  // unless the schedule wrote the copies with the update (compute_copies_current_).
  void refresh_compute_span(size_t index, const ParameterPointers& params);
  // The blocks and the final norm of each architecture's forward, residual[0] to ln_f.
  void gpt2_forward_blocks(const ParameterPointers& params, ForwardHooks& hooks);
  void llama_forward_blocks(const ParameterPointers& params, ForwardHooks& hooks);
  void llama_block_forward(int layer, const T* p, bool through_mlp);
  // One block's backward, from dL/d(its output) in d_residual to dL/d(its input) there, writing
  // its weights' gradient g.
  void gpt2_block_backward(int layer, const T* p, float* g);
  void llama_block_backward(int layer, const T* p, float* g);
  // --recompute 3: GPT-2's block `layer`'s saved activations again, from its input
  // residual[layer] and its weights `p`, in the stream's order before its backward (the Llama
  // family's is llama_block_forward without the MLP's output).
  void gpt2_recompute_block(int layer, const T* p);
  // Span indices in layout order: embeddings, blocks 0..L-1, final norm.
  static size_t block_span(int layer) { return static_cast<size_t>(1 + layer); }
  size_t final_norm_span() const { return static_cast<size_t>(1 + config_.n_layer); }
  // The attention of the last forward's batch shape.
  cuda::AttentionShape attention_shape() const {
    return {batch_, seq_len_, config_.n_head, config_.kv_heads(), config_.head_dim()};
  }
  // Block activations a's attention, by cuDNN where it runs, else by layup's kernel: the forward
  // from a.qkv into a.att_out and a.att_lse; the backward from arena_.d_att_out into
  // arena_.d_qkv, which it overwrites.
  void attention_forward(BlockActivations& a) {
    if (use_cudnn_attention(seq_len_)) {
      if constexpr (!std::is_same_v<T, float>)
        cudnn_attention_->forward(a.att_out, a.att_lse, a.qkv, attention_shape());
    } else {
      cuda::attention_forward(a.att_out, a.att_lse, a.qkv, attention_shape(), stream_);
    }
  }
  void attention_backward(const BlockActivations& a) {
    if (use_cudnn_attention(seq_len_)) {
      // cuDNN writes all of dq, dk and dv.
      if constexpr (!std::is_same_v<T, float>)
        cudnn_attention_->backward(arena_.d_qkv, arena_.d_att_out, a.qkv, a.att_out, a.att_lse,
                                   attention_shape());
    } else {
      // layup's kernel accumulates.
      zero(arena_.d_qkv, static_cast<size_t>(batch_) * seq_len_ * config_.qkv_width());
      cuda::attention_backward(arena_.d_qkv, arena_.d_att_out, a.qkv, a.att_out, a.att_lse,
                               attention_shape(), arena_.scratch, stream_);
    }
  }
  // cuDNN attention where present, except for single-position sequences, which it rejects.
  bool use_cudnn_attention(int seq_len) const { return cudnn_attention_ && seq_len > 1; }
  void zero(T* buffer, size_t count) {
    LAYUP_CUDA_CHECK(cudaMemsetAsync(buffer, 0, count * sizeof(T), stream_));
  }

  ModelConfig config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_len_;
  int recompute_;  // see cuda_backend.h
  cudaStream_t stream_ = nullptr;
  // The ledger the buffers are recorded in (may be null), and their records, which give the bytes
  // back when the backend goes.
  std::shared_ptr<MemoryAccountant> accountant_;
  std::vector<MemoryRecord> memory_records_;
  // What the constructor allocates (cuda_backend_buffers.h), and the allocations.
  CudaBackendBuffers buffers_;
  std::array<CudaAllocation, kArenaRegions> regions_;  // ArenaRegion order
  CudaAllocation cublaslt_workspace_, pinned_staging_;
  // What carve() cut the regions by, and the buffers it placed there.
  CudaArenaShape shape_;
  CudaArena<T> arena_;

  std::unique_ptr<cuda::CublasLt> blas_;
  // cuDNN's workspace, sized by cuDNN as it builds its graphs; recorded here at each size.
  cuda::GrowableWorkspace cudnn_workspace_;
  MemoryRecord cudnn_workspace_record_;
  // bf16 mode: cuDNN's fused attention unless --attention says layup or this build and machine
  // lack it; null means layup's kernel. fp32 always uses layup's kernel.
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;
  // The schedule wrote the copy from the current master weights (ModelBackend::compute_copy):
  // forwards read it without casting.
  bool compute_copies_current_ = false;

  // The last forward's shape, and the number of its embedding backward's segments.
  int batch_ = 0, seq_len_ = 0;
  int segments_ = 0;
  // The pinned staging (pinned_staging_layout) for the batch's uploads and the losses coming back.
  int32_t* host_ints_ = nullptr;  // inputs [BT], targets [BT], positions [BT], starts [BT+1],
                                  // tokens [BT]
  float* host_losses_ = nullptr;  // [BT]

  bool logits_valid_ = false;
  mutable std::vector<float> host_logits_;
  mutable std::vector<T> host_logits_raw_;  // bf16 mode: the logits as they come off the GPU

  BackwardStep next_step_ = BackwardStep::kNeedsForwardWithTargets;
  int next_layer_ = -1;
};

template <class T>
CudaBackend<T>::CudaBackend(const ModelConfig& config, int max_batch, int max_seq_len,
                            int recompute, std::shared_ptr<MemoryAccountant> accountant,
                            const CudaArenaKinds& kinds, AlgorithmChoice algorithms,
                            AttentionChoice attention)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      recompute_(recompute),
      accountant_(std::move(accountant)),
      cudnn_workspace_([this](size_t bytes) {
        cudnn_workspace_record_.reset();  // the old allocation is gone before the new one comes
        if (bytes > 0)
          cudnn_workspace_record_ = MemoryRecord(accountant_, MemorySide::kDevice,
                                                 TensorClass::kScratch, MemoryKind::kDevice, bytes);
      }) {
  validate_config(config);
  LAYUP_CHECK(recompute >= 0 && recompute <= kMaxRecompute, "--recompute takes 0, 1, 2 or 3, not ",
              recompute);
  LAYUP_CHECK(max_batch >= 1 && max_seq_len >= 1, "the CUDA backend needs a batch size and a ",
              "sequence length of at least 1 (got ", max_batch, " x ", max_seq_len, ")");
  check_sequence_length(config, max_seq_len);
  LAYUP_CHECK(config.head_dim() <= cuda::kMaxAttentionHeadDim, "the CUDA attention kernels take ",
              "head dimensions up to ", cuda::kMaxAttentionHeadDim, "; this model has ",
              config.head_dim());
  LAYUP_CHECK(static_cast<long long>(max_batch) * config.n_head <= 65535, "batch ", max_batch,
              " x ", config.n_head,
              " heads exceeds the 65535 attention blocks of one grid "
              "dimension; use a smaller --batch");
  std::string why;
  LAYUP_CHECK(cuda_device_available(&why), "cannot use the CUDA backend: ", why);

  // Everything is allocated as cuda_backend_buffers lists it, the list the memory plan sums, and
  // carve() places the buffers in the regions it measured for that list: the plan and the
  // allocations cannot differ.
  constexpr ComputeDtype dtype =
      std::is_same_v<T, float> ? ComputeDtype::kFloat32 : ComputeDtype::kBFloat16;
  buffers_ = describe_cuda_backend_buffers(config, max_batch, max_seq_len, dtype, recompute, kinds);
  const std::string context = " at B=" + std::to_string(max_batch) +
                              ", T=" + std::to_string(max_seq_len) + " (" +
                              compute_dtype_name(dtype) + ")";
  LAYUP_CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: see cuda_device.h
  try {
    for (int r = 0; r < kArenaRegions; ++r)
      regions_[r] = cuda_allocate(buffers_.regions[r], context);
    cublaslt_workspace_ = cuda_allocate(buffers_.cublaslt_workspace, context);
    pinned_staging_ = cuda_allocate(buffers_.pinned_staging, context);
  } catch (...) {
    cudaStreamDestroy(stream_);  // the allocations free themselves
    throw;
  }
  for (const PlannedAllocation& region : buffers_.regions)
    memory_records_.push_back(record_planned(accountant_, region));
  memory_records_.push_back(record_planned(accountant_, buffers_.cublaslt_workspace));
  memory_records_.push_back(record_planned(accountant_, buffers_.pinned_staging));

  // The list measured the regions with a 2-byte stand-in for bf16: the same offsets as T's.
  static_assert(sizeof(T) == sizeof(float) || sizeof(T) == sizeof(uint16_t));
  shape_ = cuda_arena_shape<T>(config, max_batch, max_seq_len, recompute);
  Carver place({static_cast<char*>(regions_[0].get()), static_cast<char*>(regions_[1].get()),
                static_cast<char*>(regions_[2].get())});
  arena_.carve(place, shape_);
  for (int r = 0; r < kArenaRegions; ++r)
    LAYUP_CHECK(place.used(static_cast<ArenaRegion>(r)) == buffers_.regions[r].bytes,
                "internal error: the CUDA backend's ", buffers_.regions[r].what, " took ",
                place.used(static_cast<ArenaRegion>(r)), " bytes, cuda_backend_buffers listed ",
                buffers_.regions[r].bytes);
  if (config.is_llama()) {
    // Positions are 0..T-1 in every sequence, so one table of max_seq_len rows serves them all;
    // made on the host with the CPU backend's steps (model/rope_tables.h), so both rotate alike.
    const int half = config.head_dim() / 2;
    std::vector<float> inv_freq(half), cos(static_cast<size_t>(max_seq_len) * half),
        sin(cos.size());
    rope_inverse_frequencies(inv_freq.data(), config.head_dim(), config.rope_theta,
                             config.rope_scaling);
    rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), max_seq_len, config.head_dim());
    LAYUP_CUDA_CHECK(cudaMemcpy(arena_.rope_cos, cos.data(), cos.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
    LAYUP_CUDA_CHECK(cudaMemcpy(arena_.rope_sin, sin.data(), sin.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
  }
  const PinnedStagingLayout staging = pinned_staging_layout(max_batch, max_seq_len);
  host_ints_ = static_cast<int32_t*>(pinned_staging_.get());
  host_losses_ = reinterpret_cast<float*>(host_ints_ + staging.ints);

  blas_ = std::make_unique<cuda::CublasLt>(cublaslt_workspace_.get(),
                                           buffers_.cublaslt_workspace.bytes, algorithms);
  if constexpr (!std::is_same_v<T, float>) {
    std::string why;
    if (attention != AttentionChoice::kLayup && cuda::CudnnAttention::available(&why)) {
      cudnn_attention_ =
          std::make_unique<cuda::CudnnAttention>(stream_, cudnn_workspace_, algorithms);
    } else {
      LAYUP_CHECK(attention != AttentionChoice::kCudnn,
                  "--attention cudnn, but cuDNN attention is unavailable: ", why);
    }
  }
}

template <class T>
CudaBackend<T>::~CudaBackend() {
  // Destructors cannot throw: free what was made and ignore the status.
  if (stream_) cudaStreamSynchronize(stream_);
  cudnn_attention_.reset();  // it works on stream_, which goes below
  if (stream_) cudaStreamDestroy(stream_);
  // The allocations free themselves after this.
}

template <class T>
void CudaBackend<T>::check_batch(const ParameterPointers& params, const TokenBatch& batch) const {
  check_token_batch("CUDA", config_, max_batch_, max_seq_len_, params, batch);
}

template <class T>
SpanPointers<const T> CudaBackend<T>::weights(const ParameterPointers& params) const {
  if constexpr (std::is_same_v<T, float>) {
    return params;
  } else {
    SpanPointers<const T> result;
    const std::vector<Span>& spans = layout_.spans();
    for (size_t i = 0; i < spans.size(); ++i) {
      const T* span = arena_.compute_weights + shape_.compute_span_offsets[i];
      if (spans[i].kind == SpanKind::kEmbeddings)
        result.embeddings = span;
      else if (spans[i].kind == SpanKind::kBlock)
        result.blocks.push_back(span);
      else
        result.final_norm = span;
    }
    return result;
  }
}

template <class T>
void CudaBackend<T>::refresh_compute_span(size_t index, const ParameterPointers& params) {
  if constexpr (!std::is_same_v<T, float>) {
    if (compute_copies_current_) return;
    const Span& span = layout_.spans()[index];
    const float* master = span.kind == SpanKind::kEmbeddings ? params.embeddings
                          : span.kind == SpanKind::kBlock    ? params.blocks[span.layer]
                                                             : params.final_norm;
    cuda::cast_to_bf16(arena_.compute_weights + shape_.compute_span_offsets[index], master,
                       span.count, stream_);
  }
}

// Each hook runs right before the first kernel that reads its span's weights is enqueued (in
// bf16, before that span's cast into the compute copy): embeddings first (the token embedding;
// the tied LM head reads wte again at the end), block l before its first layer norm -- which, for
// l > 0, is fused into the end of block l-1 -- and the final norm before ln_f.
template <class T>
float CudaBackend<T>::forward(const ParameterPointers& params, const TokenBatch& batch,
                              ForwardHooks& hooks) {
  check_batch(params, batch);
  batch_ = batch.batch;
  seq_len_ = batch.seq_len;
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();

  // Host staging: the previous forward synchronized, so its uploads are done.
  int32_t* host_inputs = host_ints_;
  int32_t* host_targets = host_inputs + BT;
  std::copy_n(batch.inputs, BT, host_inputs);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.tokens, host_inputs, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  const SpanPointers<const T> w = weights(params);

  hooks.before_embeddings();
  refresh_compute_span(0, params);
  cuda::embedding_forward(arena_.residual[0], arena_.tokens, w.embeddings + e.wte,
                          tensor_at(w.embeddings, e.wpe), B, T_, C, stream_);
  if (config_.is_llama())
    llama_forward_blocks(params, hooks);
  else
    gpt2_forward_blocks(params, hooks);
  // The head: the token embedding when tied (GPT-2 always), else lm_head in the final norm's span.
  const T* head = config_.tie_word_embeddings ? w.embeddings + e.wte : w.final_norm + f.lm_head;
  cuda::matmul_forward(*blas_, arena_.logits, arena_.ln_f, head, static_cast<const T*>(nullptr), BT,
                       C, Vp, stream_);
  logits_valid_ = true;

  if (!batch.targets) {
    next_step_ = BackwardStep::kNeedsForwardWithTargets;
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::copy_n(batch.targets, BT, host_targets);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.targets, host_targets, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  cuda::classifier_forward(arena_.losses, arena_.logsumexp, arena_.logits, arena_.targets, BT, V,
                           Vp, stream_);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(host_losses_, arena_.losses, BT * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));

  // While the GPU runs the forward: group the positions by token for the embedding backward.
  const cuda::EmbeddingBackwardPlan plan = cuda::make_embedding_backward_plan(host_inputs, BT);
  segments_ = plan.segments();
  int32_t* host_positions = host_targets + BT;
  int32_t* host_starts = host_positions + BT;
  int32_t* host_segment_tokens = host_starts + BT + 1;
  std::copy(plan.positions.begin(), plan.positions.end(), host_positions);
  std::copy(plan.segment_start.begin(), plan.segment_start.end(), host_starts);
  std::copy(plan.segment_token.begin(), plan.segment_token.end(), host_segment_tokens);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.positions, host_positions, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.segment_start, host_starts,
                                   (segments_ + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   stream_));
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.segment_token, host_segment_tokens,
                                   segments_ * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));

  LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += host_losses_[n];
  next_step_ = BackwardStep::kHead;
  return static_cast<float>(total / BT);
}

// GPT-2's blocks and final layer norm, residual[0] to ln_f. Every layer norm after the first is
// fused with the residual add before it: block l's ln_2 with its attention branch's add, block
// l+1's ln_1 (or ln_f) with block l's MLP branch's add.
template <class T>
void CudaBackend<T>::gpt2_forward_blocks(const ParameterPointers& params, ForwardHooks& hooks) {
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd, L = config_.n_layer;
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  const FinalNormOffsets& f = layout_.final_norm();
  const SpanPointers<const T> w = weights(params);
  hooks.before_block(0);
  refresh_compute_span(block_span(0), params);
  cuda::layernorm_forward(arena_.blocks[0].ln_1, arena_.blocks[0].ln_1_mean,
                          arena_.blocks[0].ln_1_rstd, arena_.residual[0],
                          w.blocks[0] + o.ln_1_weight, w.blocks[0] + o.ln_1_bias, BT, C, eps,
                          stream_);
  for (int l = 0; l < L; ++l) {
    const T* p = w.blocks[l];
    BlockActivations& a = arena_.blocks[l];
    const T* x = arena_.residual[l];
    cuda::matmul_forward(*blas_, a.qkv, a.ln_1, p + o.attn_qkv_weight, p + o.attn_qkv_bias, BT, C,
                         3 * C, stream_);
    attention_forward(a);
    cuda::matmul_forward(*blas_, arena_.branch_out, a.att_out, p + o.attn_proj_weight,
                         p + o.attn_proj_bias, BT, C, C, stream_);
    cuda::residual_layernorm_forward(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd, x,
                                     arena_.branch_out, p + o.ln_2_weight, p + o.ln_2_bias, BT, C,
                                     eps, stream_);
    if (shape_.fuse_gelu) {
      cuda::matmul_gelu_forward(*blas_, a.fc_gelu, a.fc, a.ln_2, p + o.mlp_fc_weight,
                                p + o.mlp_fc_bias, BT, C, 4 * C, stream_);
    } else {
      cuda::matmul_forward(*blas_, a.fc, a.ln_2, p + o.mlp_fc_weight, p + o.mlp_fc_bias, BT, C,
                           4 * C, stream_);
      cuda::gelu_forward(a.fc_gelu, a.fc, BT * 4 * C, stream_);
    }
    cuda::matmul_forward(*blas_, arena_.branch_out, a.fc_gelu, p + o.mlp_proj_weight,
                         p + o.mlp_proj_bias, BT, 4 * C, C, stream_);
    if (l + 1 < L) {
      hooks.before_block(l + 1);
      refresh_compute_span(block_span(l + 1), params);
      BlockActivations& next = arena_.blocks[l + 1];
      const T* next_p = w.blocks[l + 1];
      cuda::residual_layernorm_forward(
          arena_.residual[l + 1], next.ln_1, next.ln_1_mean, next.ln_1_rstd, a.residual_mid,
          arena_.branch_out, next_p + o.ln_1_weight, next_p + o.ln_1_bias, BT, C, eps, stream_);
    } else {
      hooks.before_head();
      refresh_compute_span(final_norm_span(), params);
      cuda::residual_layernorm_forward(
          arena_.residual[L], arena_.ln_f, arena_.ln_f_mean, arena_.ln_f_rstd, a.residual_mid,
          arena_.branch_out, w.final_norm + f.weight, w.final_norm + f.bias, BT, C, eps, stream_);
    }
  }
}

// The Llama family's blocks and final RMSNorm, residual[0] to ln_f (llama_block_forward).
template <class T>
void CudaBackend<T>::llama_forward_blocks(const ParameterPointers& params, ForwardHooks& hooks) {
  const int BT = batch_ * seq_len_, C = config_.n_embd, L = config_.n_layer;
  const SpanPointers<const T> w = weights(params);
  for (int l = 0; l < L; ++l) {
    hooks.before_block(l);
    refresh_compute_span(block_span(l), params);
    llama_block_forward(l, w.blocks[l], /*through_mlp=*/true);
  }
  hooks.before_head();
  refresh_compute_span(final_norm_span(), params);
  cuda::rmsnorm_forward(arena_.ln_f, arena_.ln_f_rstd, arena_.residual[L],
                        w.final_norm + layout_.final_norm().weight, BT, C,
                        config_.layer_norm_epsilon, stream_);
}

// One Llama-family block from its input residual[layer]: RMSNorm, q,k,v (rotated in place),
// grouped-query attention, o_proj and the residual add, RMSNorm, gate and up, SwiGLU; then, with
// through_mlp, down_proj and the add into residual[layer + 1] (--recompute 3 stops before them:
// the backward needs neither).
template <class T>
void CudaBackend<T>::llama_block_forward(int layer, const T* p, bool through_mlp) {
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd, I = config_.mlp_width(), Q = config_.qkv_width();
  const int A = config_.n_head * config_.head_dim();
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  BlockActivations& a = arena_.blocks[layer];
  const T* x = arena_.residual[layer];
  cuda::rmsnorm_forward(a.ln_1, a.ln_1_rstd, x, p + o.ln_1_weight, BT, C, eps, stream_);
  cuda::matmul_forward(*blas_, a.qkv, a.ln_1, p + o.attn_qkv_weight, tensor_at(p, o.attn_qkv_bias),
                       BT, C, Q, stream_);
  // q's and k's heads are adjacent in each row: one rotation covers both, v is left alone.
  cuda::rope_forward(a.qkv, arena_.rope_cos, arena_.rope_sin, B, T_,
                     config_.n_head + config_.kv_heads(), config_.head_dim(), Q, stream_);
  attention_forward(a);
  cuda::matmul_forward(*blas_, arena_.branch_out, a.att_out, p + o.attn_proj_weight,
                       tensor_at(p, o.attn_proj_bias), BT, A, C, stream_);
  cuda::residual_forward(a.residual_mid, x, arena_.branch_out, BT * C, stream_);
  cuda::rmsnorm_forward(a.ln_2, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight, BT, C, eps,
                        stream_);
  cuda::matmul_forward(*blas_, a.fc, a.ln_2, p + o.mlp_fc_weight, static_cast<const T*>(nullptr),
                       BT, C, 2 * I, stream_);
  cuda::swiglu_forward(a.fc_gelu, a.fc, BT, I, stream_);
  if (!through_mlp) return;
  cuda::matmul_forward(*blas_, arena_.branch_out, a.fc_gelu, p + o.mlp_proj_weight,
                       static_cast<const T*>(nullptr), BT, I, C, stream_);
  cuda::residual_forward(arena_.residual[layer + 1], a.residual_mid, arena_.branch_out, BT * C,
                         stream_);
}

template <class T>
const float* CudaBackend<T>::logits() const {
  LAYUP_CHECK(logits_valid_, "the CUDA backend's logits are gone: backward_head turns them into ",
              "their gradient in place; read logits() after forward and before the backward");
  const size_t count = static_cast<size_t>(batch_) * seq_len_ * config_.padded_vocab_size;
  host_logits_.resize(count);
  if constexpr (std::is_same_v<T, float>) {
    LAYUP_CUDA_CHECK(cudaMemcpy(host_logits_.data(), arena_.logits, count * sizeof(float),
                                cudaMemcpyDeviceToHost));
  } else {
    host_logits_raw_.resize(count);
    LAYUP_CUDA_CHECK(cudaMemcpy(host_logits_raw_.data(), arena_.logits, count * sizeof(T),
                                cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) host_logits_[i] = cuda::to_float(host_logits_raw_[i]);
  }
  return host_logits_.data();
}

template <class T>
void CudaBackend<T>::backward_head(const ParameterPointers& params, float* final_norm_grad,
                                   float* embeddings_grad, float loss_scale) {
  LAYUP_CHECK(next_step_ != BackwardStep::kNeedsForwardWithTargets,
              "backward_head needs a forward pass with targets first (on the CUDA backend, one "
              "forward per backward pass: the head's backward consumes the logits)");
  LAYUP_CHECK(next_step_ == BackwardStep::kHead,
              "backward_head called in the middle of a backward pass; finish it with the blocks "
              "and backward_embeddings first");
  const int BT = batch_ * seq_len_, C = config_.n_embd;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();
  const SpanPointers<const T> w = weights(params);
  const float dloss = loss_scale / BT;  // d(mean loss) / d(loss of one position), scaled

  // dlogits, in place of the logits: the buffer is the largest activation, and nothing else needs
  // the logits once the loss is known.
  cuda::classifier_backward(arena_.logits, arena_.logits, arena_.logsumexp, arena_.targets, BT, V,
                            Vp, dloss, stream_);
  logits_valid_ = false;
  // The head writes the whole embeddings span's gradient (ModelBackend): when tied, wte's part
  // here and the rest (GPT-2's wpe) zeroed; untied, the head's own gradient goes into the final
  // norm's span and all of the embeddings' is zeroed. backward_embeddings adds the input
  // embedding's part.
  const bool tied = config_.tie_word_embeddings;
  const T* head = tied ? w.embeddings + e.wte : w.final_norm + f.lm_head;
  float* head_grad = tied ? embeddings_grad + e.wte : final_norm_grad + f.lm_head;
  cuda::matmul_backward(*blas_, arena_.d_ln, head_grad, nullptr, arena_.logits, arena_.ln_f, head,
                        BT, C, Vp, arena_.scratch, cuda::InputGradient::kOverwrite,
                        cuda::WeightGradient::kOverwrite, stream_);
  const size_t written = tied ? static_cast<size_t>(Vp) * C : 0;  // wte comes first in the span
  LAYUP_CUDA_CHECK(
      cudaMemsetAsync(embeddings_grad + written, 0, (e.count - written) * sizeof(float), stream_));
  zero(arena_.d_residual, static_cast<size_t>(BT) * C);
  if (config_.is_llama()) {
    cuda::rmsnorm_backward(arena_.d_residual, final_norm_grad + f.weight, arena_.d_ln,
                           arena_.residual[config_.n_layer], w.final_norm + f.weight,
                           arena_.ln_f_rstd, BT, C, cuda::WeightGradient::kOverwrite,
                           arena_.scratch, stream_);
  } else {
    cuda::layernorm_backward(
        arena_.d_residual, final_norm_grad + f.weight, final_norm_grad + f.bias, arena_.d_ln,
        arena_.residual[config_.n_layer], w.final_norm + f.weight, arena_.ln_f_mean,
        arena_.ln_f_rstd, BT, C, cuda::WeightGradient::kOverwrite, arena_.scratch, stream_);
  }
  next_step_ = BackwardStep::kBlock;
  next_layer_ = config_.n_layer - 1;
}

template <class T>
void CudaBackend<T>::backward_block(int layer, const ParameterPointers& params, float* block_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kBlock && layer == next_layer_, "backward_block(", layer,
              ") is out of order: backward runs backward_head, then blocks ", config_.n_layer - 1,
              " down to 0, then backward_embeddings",
              next_step_ == BackwardStep::kBlock ? "; the next block is " : "",
              next_step_ == BackwardStep::kBlock ? std::to_string(next_layer_) : "");
  const T* p = weights(params).blocks[layer];
  if (config_.is_llama())
    llama_block_backward(layer, p, block_grad);
  else
    gpt2_block_backward(layer, p, block_grad);
  next_layer_ = layer - 1;
  if (layer == 0) next_step_ = BackwardStep::kEmbeddings;
}

template <class T>
void CudaBackend<T>::gpt2_block_backward(int layer, const T* p, float* g) {
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd;
  const BlockOffsets& o = layout_.block();
  const BlockActivations& a = arena_.blocks[layer];
  // --recompute 3: the block's activations again from its input; the last block's are still
  // there from the forward.
  if (recompute_ >= 3 && layer + 1 < config_.n_layer) gpt2_recompute_block(layer, p);

  // MLP branch. arena_.d_residual holds dL/d(block output) = dL/d(MLP output).
  // --recompute: GELU's output (and the layer norms' below) back into the shared buffers. The
  // recomputed values are the forward's bit for bit where the forward used the same kernel (fp32);
  // in bf16 the forward's GELU ran in the matmul epilogue, so they may differ by a rounding.
  if (recompute_ >= 1) cuda::gelu_forward(a.fc_gelu, a.fc, BT * 4 * C, stream_);
  if (shape_.fuse_gelu) {
    cuda::matmul_backward_through_gelu(*blas_, arena_.d_fc, g + o.mlp_proj_weight,
                                       g + o.mlp_proj_bias, arena_.d_residual, a.fc_gelu, a.fc,
                                       p + o.mlp_proj_weight, BT, 4 * C, C, arena_.scratch,
                                       cuda::WeightGradient::kOverwrite, stream_);
  } else {
    cuda::matmul_backward(*blas_, arena_.d_fc_gelu, g + o.mlp_proj_weight, g + o.mlp_proj_bias,
                          arena_.d_residual, a.fc_gelu, p + o.mlp_proj_weight, BT, 4 * C, C,
                          arena_.scratch, cuda::InputGradient::kOverwrite,
                          cuda::WeightGradient::kOverwrite, stream_);
    zero(arena_.d_fc, static_cast<size_t>(BT) * 4 * C);
    cuda::gelu_backward(arena_.d_fc, a.fc, arena_.d_fc_gelu, BT * 4 * C, stream_);
  }
  if (recompute_ >= 2) {
    cuda::layernorm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight,
                            p + o.ln_2_bias, BT, C, config_.layer_norm_epsilon, stream_);
  }
  cuda::matmul_backward(*blas_, arena_.d_ln, g + o.mlp_fc_weight, g + o.mlp_fc_bias, arena_.d_fc,
                        a.ln_2, p + o.mlp_fc_weight, BT, C, 4 * C, arena_.scratch,
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, stream_);
  // Adding ln_2's input gradient turns arena_.d_residual into dL/d(residual_mid).
  cuda::layernorm_backward(arena_.d_residual, g + o.ln_2_weight, g + o.ln_2_bias, arena_.d_ln,
                           a.residual_mid, p + o.ln_2_weight, a.ln_2_mean, a.ln_2_rstd, BT, C,
                           cuda::WeightGradient::kOverwrite, arena_.scratch, stream_);

  // Attention branch. arena_.d_residual holds dL/d(residual_mid) = dL/d(attention branch output).
  cuda::matmul_backward(*blas_, arena_.d_att_out, g + o.attn_proj_weight, g + o.attn_proj_bias,
                        arena_.d_residual, a.att_out, p + o.attn_proj_weight, BT, C, C,
                        arena_.scratch, cuda::InputGradient::kOverwrite,
                        cuda::WeightGradient::kOverwrite, stream_);
  attention_backward(a);
  if (recompute_ >= 2) {
    cuda::layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, arena_.residual[layer],
                            p + o.ln_1_weight, p + o.ln_1_bias, BT, C, config_.layer_norm_epsilon,
                            stream_);
  }
  cuda::matmul_backward(*blas_, arena_.d_ln, g + o.attn_qkv_weight, g + o.attn_qkv_bias,
                        arena_.d_qkv, a.ln_1, p + o.attn_qkv_weight, BT, C, 3 * C, arena_.scratch,
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, stream_);
  // Adding ln_1's input gradient turns arena_.d_residual into dL/d(block input).
  cuda::layernorm_backward(arena_.d_residual, g + o.ln_1_weight, g + o.ln_1_bias, arena_.d_ln,
                           arena_.residual[layer], p + o.ln_1_weight, a.ln_1_mean, a.ln_1_rstd, BT,
                           C, cuda::WeightGradient::kOverwrite, arena_.scratch, stream_);
}

// The transpose of llama_block_forward, as the CPU backend's llama_block_backward, with the
// --recompute levels of GPT-2's: 1 SwiGLU's output again, 2 the norms' outputs too, 3 the block's
// forward up to SwiGLU.
template <class T>
void CudaBackend<T>::llama_block_backward(int layer, const T* p, float* g) {
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd, I = config_.mlp_width(), Q = config_.qkv_width();
  const int A = config_.n_head * config_.head_dim();
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  const BlockActivations& a = arena_.blocks[layer];
  constexpr auto kOverwriteInput = cuda::InputGradient::kOverwrite;
  constexpr auto kOverwriteWeight = cuda::WeightGradient::kOverwrite;
  // The last block's activations are still there from the forward.
  if (recompute_ >= 3 && layer + 1 < config_.n_layer) llama_block_forward(layer, p, false);

  // MLP branch. arena_.d_residual holds dL/d(block output) = dL/d(MLP output).
  if (recompute_ >= 1) cuda::swiglu_forward(a.fc_gelu, a.fc, BT, I, stream_);
  cuda::matmul_backward(*blas_, arena_.d_fc_gelu, g + o.mlp_proj_weight, nullptr, arena_.d_residual,
                        a.fc_gelu, p + o.mlp_proj_weight, BT, I, C, arena_.scratch, kOverwriteInput,
                        kOverwriteWeight, stream_);
  zero(arena_.d_fc, static_cast<size_t>(BT) * 2 * I);  // SwiGLU's backward accumulates
  cuda::swiglu_backward(arena_.d_fc, arena_.d_fc_gelu, a.fc, BT, I, stream_);
  if (recompute_ >= 2)
    cuda::rmsnorm_forward(a.ln_2, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight, BT, C, eps,
                          stream_);
  cuda::matmul_backward(*blas_, arena_.d_ln, g + o.mlp_fc_weight, nullptr, arena_.d_fc, a.ln_2,
                        p + o.mlp_fc_weight, BT, C, 2 * I, arena_.scratch, kOverwriteInput,
                        kOverwriteWeight, stream_);
  // Adding the norm's input gradient turns arena_.d_residual into dL/d(residual_mid).
  cuda::rmsnorm_backward(arena_.d_residual, g + o.ln_2_weight, arena_.d_ln, a.residual_mid,
                         p + o.ln_2_weight, a.ln_2_rstd, BT, C, kOverwriteWeight, arena_.scratch,
                         stream_);

  // Attention branch. arena_.d_residual holds dL/d(residual_mid) = dL/d(attention branch output).
  cuda::matmul_backward(*blas_, arena_.d_att_out, g + o.attn_proj_weight,
                        tensor_at(g, o.attn_proj_bias), arena_.d_residual, a.att_out,
                        p + o.attn_proj_weight, BT, A, C, arena_.scratch, kOverwriteInput,
                        kOverwriteWeight, stream_);
  attention_backward(a);
  // From the rotated q and k back to the projection's outputs, in place.
  cuda::rope_backward(arena_.d_qkv, arena_.rope_cos, arena_.rope_sin, B, T_,
                      config_.n_head + config_.kv_heads(), config_.head_dim(), Q, stream_);
  if (recompute_ >= 2)
    cuda::rmsnorm_forward(a.ln_1, a.ln_1_rstd, arena_.residual[layer], p + o.ln_1_weight, BT, C,
                          eps, stream_);
  cuda::matmul_backward(*blas_, arena_.d_ln, g + o.attn_qkv_weight, tensor_at(g, o.attn_qkv_bias),
                        arena_.d_qkv, a.ln_1, p + o.attn_qkv_weight, BT, C, Q, arena_.scratch,
                        kOverwriteInput, kOverwriteWeight, stream_);
  // Adding the norm's input gradient turns arena_.d_residual into dL/d(block input).
  cuda::rmsnorm_backward(arena_.d_residual, g + o.ln_1_weight, arena_.d_ln, arena_.residual[layer],
                         p + o.ln_1_weight, a.ln_1_rstd, BT, C, kOverwriteWeight, arena_.scratch,
                         stream_);
}

template <class T>
void CudaBackend<T>::gpt2_recompute_block(int layer, const T* p) {
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd;
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  BlockActivations& a = arena_.blocks[layer];
  // The forward's ops on the same inputs, up to what the backward reads (the MLP's projection is
  // not needed); arena_.branch_out is free during the backward.
  cuda::layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, arena_.residual[layer],
                          p + o.ln_1_weight, p + o.ln_1_bias, BT, C, eps, stream_);
  cuda::matmul_forward(*blas_, a.qkv, a.ln_1, p + o.attn_qkv_weight, p + o.attn_qkv_bias, BT, C,
                       3 * C, stream_);
  attention_forward(a);
  cuda::matmul_forward(*blas_, arena_.branch_out, a.att_out, p + o.attn_proj_weight,
                       p + o.attn_proj_bias, BT, C, C, stream_);
  cuda::residual_layernorm_forward(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd,
                                   arena_.residual[layer], arena_.branch_out, p + o.ln_2_weight,
                                   p + o.ln_2_bias, BT, C, eps, stream_);
  if (shape_.fuse_gelu) {
    cuda::matmul_gelu_forward(*blas_, a.fc_gelu, a.fc, a.ln_2, p + o.mlp_fc_weight,
                              p + o.mlp_fc_bias, BT, C, 4 * C, stream_);
  } else {
    cuda::matmul_forward(*blas_, a.fc, a.ln_2, p + o.mlp_fc_weight, p + o.mlp_fc_bias, BT, C, 4 * C,
                         stream_);
    cuda::gelu_forward(a.fc_gelu, a.fc, BT * 4 * C, stream_);
  }
}

template <class T>
void CudaBackend<T>::backward_embeddings(const ParameterPointers& /*params*/,
                                         float* embeddings_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kEmbeddings,
              "backward_embeddings called before the backward of block 0");
  const EmbeddingOffsets& e = layout_.embeddings();
  cuda::embedding_backward(embeddings_grad + e.wte, tensor_at(embeddings_grad, e.wpe),
                           arena_.d_residual, arena_.positions, arena_.segment_start,
                           arena_.segment_token, segments_, batch_, seq_len_, config_.n_embd,
                           stream_);
  // The logits were consumed by backward_head: another backward needs another forward.
  next_step_ = BackwardStep::kNeedsForwardWithTargets;
}

}  // namespace

std::unique_ptr<ModelBackend> make_cuda_backend(const ModelConfig& config, int max_batch,
                                                int max_seq_len, ComputeDtype dtype, int recompute,
                                                std::shared_ptr<MemoryAccountant> accountant,
                                                const CudaArenaKinds& kinds,
                                                AlgorithmChoice algorithms,
                                                AttentionChoice attention) {
  if (dtype == ComputeDtype::kFloat32)
    return std::make_unique<CudaBackend<float>>(config, max_batch, max_seq_len, recompute,
                                                std::move(accountant), kinds, algorithms,
                                                attention);
  return std::make_unique<CudaBackend<__nv_bfloat16>>(config, max_batch, max_seq_len, recompute,
                                                      std::move(accountant), kinds, algorithms,
                                                      attention);
}

}  // namespace layup
