// The model graph (backend/model_graph.h) on the CUDA ops: CudaOps below runs each of the graph's
// ops as kernels and cuBLASLt matmuls on the backend's stream, in T (float, or __nv_bfloat16 with
// fp32 accumulation). Where it fuses: GPT-2's residual add with the layer norm after it (one
// kernel), and in bf16 its GELU with the matmul before it (cuBLASLt's epilogue, forward and
// backward); attention is cuDNN's where it runs (bf16), else layup's kernel. The matmuls and norms
// OVERWRITE their weight gradients (cuda::WeightGradient), so no gradient is zeroed first.
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
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backward_order.h"
#include "backend/cuda/cuda_arena.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/growable_workspace.h"
#include "backend/cuda/ops/attention.cuh"
#include "backend/cuda/ops/attention_cudnn.cuh"
#include "backend/cuda/ops/attention_decode.cuh"
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
#include "backend/model_graph.h"
#include "core/error.h"
#include "memory/memory_accountant.h"
#include "model/parameter_layout.h"
#include "model/rope_tables.h"

namespace layup {
namespace {

// The graph's ops (model_graph.h) for one batch, on the backend's arena, cuBLASLt handle, cuDNN
// attention (null: layup's kernel) and stream.
template <class T>
class CudaOps {
 public:
  using BlockActivations = typename CudaArena<T>::BlockActivations;

  CudaOps(const graph::Shape& shape, CudaArena<T>& arena, cuda::CublasLt& blas,
          cuda::CudnnAttention* cudnn_attention, bool fuse_gelu, int segments, cudaStream_t stream)
      : s_(shape),
        arena_(arena),
        blas_(blas),
        cudnn_attention_(cudnn_attention),
        fuse_gelu_(fuse_gelu),
        segments_(segments),
        stream_(stream) {}

  void embedding_forward(T* out, const T* wte, const T* wpe) {
    cuda::embedding_forward(out, arena_.tokens, wte, wpe, s_.B, s_.T, s_.C, stream_);
  }
  void norm_forward(T* out, float* mean, float* rstd, const T* x, const T* weight, const T* bias) {
    if (s_.norm == graph::Norm::kRmsNorm)
      cuda::rmsnorm_forward(out, rstd, x, weight, s_.rows, s_.C, s_.eps, stream_);
    else
      cuda::layernorm_forward(out, mean, rstd, x, weight, bias, s_.rows, s_.C, s_.eps, stream_);
  }
  // LayerNorm (GPT-2) runs in one kernel with the add; RMSNorm has no fused kernel.
  template <class BeforeNorm>
  void residual_norm_forward(T* sum, T* out, float* mean, float* rstd, const T* x, const T* branch,
                             const T* weight, const T* bias, BeforeNorm&& before_norm) {
    if (s_.norm == graph::Norm::kLayerNorm) {
      before_norm();
      cuda::residual_layernorm_forward(sum, out, mean, rstd, x, branch, weight, bias, s_.rows, s_.C,
                                       s_.eps, stream_);
    } else {
      residual_forward(sum, x, branch);
      before_norm();
      norm_forward(out, mean, rstd, sum, weight, bias);
    }
  }
  void residual_forward(T* sum, const T* x, const T* branch) {
    cuda::residual_forward(sum, x, branch, s_.rows * s_.C, stream_);
  }
  void matmul_forward(T* out, const T* in, const T* weight, const T* bias, int in_width,
                      int out_width) {
    cuda::matmul_forward(blas_, out, in, weight, bias, s_.rows, in_width, out_width, stream_);
  }
  void matmul_activation_forward(T* act, T* pre, const T* in, const T* weight, const T* bias,
                                 int in_width, int out_width) {
    if (fuse_gelu_) {
      cuda::matmul_gelu_forward(blas_, act, pre, in, weight, bias, s_.rows, in_width, out_width,
                                stream_);
    } else {
      matmul_forward(pre, in, weight, bias, in_width, out_width);
      activation_forward(act, pre);
    }
  }
  void activation_forward(T* act, const T* pre) {
    if (s_.activation == graph::Activation::kSwiglu)
      cuda::swiglu_forward(act, pre, s_.rows, s_.act, stream_);
    else
      cuda::gelu_forward(act, pre, s_.rows * s_.act, stream_);
  }
  void rope_forward(T* qkv) {
    cuda::rope_forward(qkv, arena_.rope_cos, arena_.rope_sin, s_.B, s_.T, s_.heads + s_.kv_heads,
                       s_.head_dim, s_.qkv, stream_);
  }
  // From a.qkv into a.att_out and a.att_lse.
  void attention_forward(BlockActivations& a) {
    if (use_cudnn_attention()) {
      if constexpr (!std::is_same_v<T, float>)
        cudnn_attention_->forward(a.att_out, a.att_lse, a.qkv, attention_shape());
    } else {
      cuda::attention_forward(a.att_out, a.att_lse, a.qkv, attention_shape(), stream_);
    }
  }

  void matmul_backward(T* din, float* dweight, float* dbias, const T* dout, const T* in,
                       const T* weight, int in_width, int out_width) {
    cuda::matmul_backward(blas_, din, dweight, dbias, dout, in, weight, s_.rows, in_width,
                          out_width, arena_.scratch, cuda::InputGradient::kOverwrite,
                          cuda::WeightGradient::kOverwrite, stream_);
  }
  void matmul_activation_backward(T* d_pre, T* d_act, float* dweight, float* dbias, const T* dout,
                                  const T* act, const T* pre, const T* weight, int in_width,
                                  int out_width) {
    if (fuse_gelu_) {
      cuda::matmul_backward_through_gelu(blas_, d_pre, dweight, dbias, dout, act, pre, weight,
                                         s_.rows, in_width, out_width, arena_.scratch,
                                         cuda::WeightGradient::kOverwrite, stream_);
      return;
    }
    matmul_backward(d_act, dweight, dbias, dout, act, weight, in_width, out_width);
    zero(d_pre, static_cast<size_t>(s_.rows) * s_.fc);  // GELU's and SwiGLU's backward accumulate
    if (s_.activation == graph::Activation::kSwiglu)
      cuda::swiglu_backward(d_pre, d_act, pre, s_.rows, s_.act, stream_);
    else
      cuda::gelu_backward(d_pre, pre, d_act, s_.rows * s_.act, stream_);
  }
  void norm_backward(T* din, float* dweight, float* dbias, const T* dout, const T* x,
                     const T* weight, const float* mean, const float* rstd) {
    if (s_.norm == graph::Norm::kRmsNorm)
      cuda::rmsnorm_backward(din, dweight, dout, x, weight, rstd, s_.rows, s_.C,
                             cuda::WeightGradient::kOverwrite, arena_.scratch, stream_);
    else
      cuda::layernorm_backward(din, dweight, dbias, dout, x, weight, mean, rstd, s_.rows, s_.C,
                               cuda::WeightGradient::kOverwrite, arena_.scratch, stream_);
  }
  void attention_backward(T* dqkv, const T* dout, const BlockActivations& a) {
    if (use_cudnn_attention()) {
      // cuDNN writes all of dq, dk and dv.
      if constexpr (!std::is_same_v<T, float>)
        cudnn_attention_->backward(dqkv, dout, a.qkv, a.att_out, a.att_lse, attention_shape());
    } else {
      // layup's kernel accumulates.
      zero(dqkv, static_cast<size_t>(s_.rows) * s_.qkv);
      cuda::attention_backward(dqkv, dout, a.qkv, a.att_out, a.att_lse, attention_shape(),
                               arena_.scratch, stream_);
    }
  }
  void rope_backward(T* dqkv) {
    cuda::rope_backward(dqkv, arena_.rope_cos, arena_.rope_sin, s_.B, s_.T, s_.heads + s_.kv_heads,
                        s_.head_dim, s_.qkv, stream_);
  }
  // The logits' gradient in place of the logits: the buffer is the largest activation, and
  // nothing else needs the logits once the loss is known.
  void lm_head_backward(T* d_in, float* dweight, T* logits, const float* logsumexp,
                        const int32_t* targets, const T* in, const T* weight, float dloss) {
    cuda::classifier_backward(logits, logits, logsumexp, targets, s_.rows, s_.V, s_.Vp, dloss,
                              stream_);
    cuda::matmul_backward(blas_, d_in, dweight, nullptr, logits, in, weight, s_.rows, s_.C, s_.Vp,
                          arena_.scratch, cuda::InputGradient::kOverwrite,
                          cuda::WeightGradient::kOverwrite, stream_);
  }
  void embedding_backward(float* dwte, float* dwpe, const T* dout) {
    cuda::embedding_backward(dwte, dwpe, dout, arena_.positions, arena_.segment_start,
                             arena_.segment_token, segments_, s_.B, s_.T, s_.C, stream_);
  }
  void zero(T* buffer, size_t count) {
    LAYUP_CUDA_CHECK(cudaMemsetAsync(buffer, 0, count * sizeof(T), stream_));
  }
  void zero_gradient(float* gradient, size_t count) {
    LAYUP_CUDA_CHECK(cudaMemsetAsync(gradient, 0, count * sizeof(float), stream_));
  }

 private:
  cuda::AttentionShape attention_shape() const {
    return {s_.B, s_.T, s_.heads, s_.kv_heads, s_.head_dim};
  }
  // cuDNN attention where present, except for single-position sequences, which it rejects.
  bool use_cudnn_attention() const { return cudnn_attention_ && s_.T > 1; }

  graph::Shape s_;
  CudaArena<T>& arena_;
  cuda::CublasLt& blas_;
  cuda::CudnnAttention* cudnn_attention_;
  // bf16 GPT-2 (CudaArenaShape::fuse_gelu). fp32, the mode that must match the CPU to 1e-5,
  // keeps the separate GELU op, which computes exactly as the CPU's.
  bool fuse_gelu_;
  int segments_;  // of the embedding backward's grouping of the batch's tokens
  cudaStream_t stream_;
};

// decode's view of the key/value cache, for a call whose new tokens start at position `first`.
template <class T>
struct CudaDecodeView {
  T *keys, *values;  // [L, max_positions, kv width]
  const float *rope_cos, *rope_sin;
  int max_positions, first;
};

// The graph's ops for generation (ModelBackend::decode): CudaOps', but for one sequence whose
// positions start at view.first, with attention over the cache.
template <class T>
class CudaDecodeOps : public CudaOps<T> {
 public:
  using BlockActivations = typename CudaArena<T>::BlockActivations;

  CudaDecodeOps(const CudaOps<T>& ops, const graph::Shape& shape, CudaArena<T>& arena,
                const CudaDecodeView<T>& view, cudaStream_t stream)
      : CudaOps<T>(ops), s_(shape), arena_(arena), view_(view), stream_(stream) {}

  void embedding_forward(T* out, const T* wte, const T* wpe) {
    cuda::embedding_forward(out, arena_.tokens, wte,
                            wpe ? wpe + static_cast<size_t>(view_.first) * s_.C : nullptr, 1, s_.T,
                            s_.C, stream_);
  }
  void rope_forward(T* qkv) {
    const size_t offset = static_cast<size_t>(view_.first) * (s_.head_dim / 2);
    cuda::rope_forward(qkv, view_.rope_cos + offset, view_.rope_sin + offset, 1, s_.T,
                       s_.heads + s_.kv_heads, s_.head_dim, s_.qkv, stream_);
  }
  void attention_forward(BlockActivations& a) {
    const auto layer = static_cast<size_t>(&a - arena_.blocks.data());
    const size_t layer_offset =
        layer * view_.max_positions * static_cast<size_t>(s_.kv_heads) * s_.head_dim;
    cuda::attention_decode_forward(a.att_out, view_.keys + layer_offset,
                                   view_.values + layer_offset, a.qkv, s_.T, view_.first, s_.heads,
                                   s_.kv_heads, s_.head_dim, stream_);
  }

 private:
  graph::Shape s_;
  CudaArena<T>& arena_;
  CudaDecodeView<T> view_;
  cudaStream_t stream_;
};

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
  size_t micro_batch_state_bytes() const override {
    return layup::micro_batch_state_bytes(config_, max_batch_, max_seq_len_, sizeof(T));
  }
  void park_micro_batch(void* store, bool with_inputs) override;
  void resume_micro_batch(const void* store, int layer) override;
  size_t hidden_state_bytes() const override {
    return layup::hidden_state_bytes(config_, max_batch_, max_seq_len_, sizeof(T));
  }
  void forward_embeddings(const ParameterPointers& params, const TokenBatch& batch, void* hidden,
                          void* store, ForwardHooks& hooks) override;
  void forward_block(int layer, const ParameterPointers& params, void* hidden, void* store,
                     ForwardHooks& hooks) override;
  float forward_head(const ParameterPointers& params, const TokenBatch& batch, const void* hidden,
                     ForwardHooks& hooks) override;
  void* compute_copy(size_t span_index) override {
    if constexpr (std::is_same_v<T, float>)
      return nullptr;
    else
      return compute_span(span_index);
  }
  bool place_compute_copy(size_t span_index, void* bf16) override {
    if constexpr (std::is_same_v<T, float>) return false;
    placed_.at(span_index) = static_cast<T*>(bf16);
    return true;
  }
  void set_compute_copies_current(bool current) override { compute_copies_current_ = current; }
  void start_decode(int max_positions) override;
  const float* decode(const ParameterPointers& params, std::span<const int32_t> tokens) override;
  int decoded_positions() const override { return decode_length_; }

 private:
  // The caller's hooks, each followed in bf16 by the cast of its span into the compute copy: a
  // hook may wait for the span's update, which the cast reads.
  class CastingHooks final : public ForwardHooks {
   public:
    CastingHooks(CudaBackend& backend, const ParameterPointers& params, ForwardHooks& hooks)
        : backend_(backend), params_(params), hooks_(hooks) {}
    void before_embeddings() override {
      hooks_.before_embeddings();
      backend_.refresh_compute_span(0, params_);
    }
    void before_block(int layer) override {
      hooks_.before_block(layer);
      backend_.refresh_compute_span(block_span(layer), params_);
    }
    void before_head() override {
      hooks_.before_head();
      backend_.refresh_compute_span(backend_.final_norm_span(), params_);
    }

   private:
    CudaBackend& backend_;
    const ParameterPointers& params_;
    ForwardHooks& hooks_;
  };

  void check_batch(const ParameterPointers& params, const TokenBatch& batch) const;
  // The pinned staging's ints, once the uploads queued from it have run.
  int32_t* staging_ints();
  // The batch's shape into sizes_ and its token ids to the device through the pinned staging
  // (forward's and the layer-major forward's uploads); returns where they lie in the staging.
  int32_t* upload_tokens(const TokenBatch& batch);
  // Uploads from the staging were queued: the next writer of it waits for them (staging_ints).
  void staging_queued();
  // The embedding backward's grouping of the BT tokens at `host_inputs` (in the staging), made on
  // the host while the GPU computes and uploaded after it.
  void upload_embedding_plan(const int32_t* host_inputs, int BT);
  // The classifier's losses of the logits against batch.targets, queued with their copy back; then
  // the mean loss once they are back, and the backward's state after it.
  void enqueue_losses(const TokenBatch& batch);
  float mean_loss(const TokenBatch& batch);
  // The tokens and the embedding backward's grouping of them into `store`
  // (ModelBackend::park_micro_batch).
  void park_tokens(void* store);
  // The weights the kernels read: the fp32 spans themselves, or their bf16 compute copy.
  SpanPointers<const T> weights(const ParameterPointers& params) const;
  // bf16 mode: span `index`'s compute copy (layout order): where the schedule placed it, else
  // the weights region's.
  T* compute_span(size_t index) const {
    if (placed_[index] != nullptr) return placed_[index];
    const size_t offset = shape_.compute_span_offsets.at(index);
    LAYUP_CHECK(offset != CudaArenaShape::kComputeCopyElsewhere, "internal error: span ", index,
                "'s compute copy lives outside the backend and was never placed");
    return arena_.compute_weights + offset;
  }
  // bf16 mode: casts span `index` (layout order) of the fp32 weights into the compute copy,
  // unless the schedule wrote the copies with the update (compute_copies_current_).
  void refresh_compute_span(size_t index, const ParameterPointers& params);
  // Span indices in layout order: embeddings, blocks 0..L-1, final norm.
  static size_t block_span(int layer) { return static_cast<size_t>(1 + layer); }
  size_t final_norm_span() const { return static_cast<size_t>(1 + config_.n_layer); }
  // The graph's ops for the last forward's batch.
  CudaOps<T> ops() {
    return CudaOps<T>(sizes_, arena_, *blas_, cudnn_attention_.get(), shape_.fuse_gelu, segments_,
                      stream_);
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
  // Per span: its compute copy where the schedule placed it (place_compute_copy), else null.
  std::vector<T*> placed_;

  // The last forward's sizes, and the number of its embedding backward's segments.
  graph::Shape sizes_;
  int segments_ = 0;
  // The pinned staging (pinned_staging_layout) for the batch's uploads and the losses coming back.
  int32_t* host_ints_ = nullptr;  // inputs [BT], targets [BT], positions [BT], starts [BT+1],
                                  // tokens [BT]
  float* host_losses_ = nullptr;  // [BT]

  bool logits_valid_ = false;
  mutable std::vector<float> host_logits_;
  mutable std::vector<T> host_logits_raw_;  // bf16 mode: the logits as they come off the GPU

  BackwardOrder order_{config_.n_layer};
  int learned_targets_ = 0;  // of the last forward: the divisor of its mean loss
  // forward_embeddings has run since the last forward or decode: the blocks may follow.
  bool layer_major_started_ = false;
  // Recorded after the last uploads from the pinned staging (staging_queued), while they may be
  // queued.
  cudaEvent_t staging_uploaded_ = nullptr;
  bool staging_busy_ = false;
  // Per parked store, its embedding backward's segment count (the rest of the grouping lies in
  // the store, in device memory).
  std::map<const void*, int> parked_segments_;

  // decode's key/value cache in T, keys then values, [L, max_positions, kv width] each, and the
  // rotary table of its positions (the arena's covers max_seq_len positions only).
  CudaAllocation decode_cache_, decode_rope_;
  MemoryRecord decode_record_;
  int decode_max_positions_ = 0, decode_length_ = 0;
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
    LAYUP_CUDA_CHECK(cudaEventCreateWithFlags(&staging_uploaded_, cudaEventDisableTiming));
    for (int r = 0; r < kArenaRegions; ++r)
      regions_[r] = cuda_allocate(buffers_.regions[r], context);
    cublaslt_workspace_ = cuda_allocate(buffers_.cublaslt_workspace, context);
    pinned_staging_ = cuda_allocate(buffers_.pinned_staging, context);
  } catch (...) {
    if (staging_uploaded_) cudaEventDestroy(staging_uploaded_);
    cudaStreamDestroy(stream_);  // the allocations free themselves
    throw;
  }
  for (const PlannedAllocation& region : buffers_.regions)
    memory_records_.push_back(record_planned(accountant_, region));
  memory_records_.push_back(record_planned(accountant_, buffers_.cublaslt_workspace));
  memory_records_.push_back(record_planned(accountant_, buffers_.pinned_staging));

  // The list measured the regions with a 2-byte stand-in for bf16: the same offsets as T's.
  static_assert(sizeof(T) == sizeof(float) || sizeof(T) == sizeof(uint16_t));
  shape_ =
      cuda_arena_shape<T>(config, max_batch, max_seq_len, recompute, kinds.compute_copy_elsewhere);
  placed_.assign(layout_.spans().size(), nullptr);
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
  if (staging_uploaded_) cudaEventDestroy(staging_uploaded_);
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
      const T* span = compute_span(i);
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
    cuda::cast_to_bf16(compute_span(index), master, span.count, stream_);
  }
}

// Each hook runs right before the first kernel that reads its span's weights is enqueued (in
// bf16, before that span's cast into the compute copy: CastingHooks).
template <class T>
float CudaBackend<T>::forward(const ParameterPointers& params, const TokenBatch& batch,
                              ForwardHooks& hooks) {
  check_batch(params, batch);
  int32_t* host_inputs = upload_tokens(batch);
  const int BT = sizes_.rows;
  CastingHooks casting(*this, params, hooks);
  CudaOps<T> graph_ops = ops();
  order_.forward_started(/*layer_major=*/false);
  layer_major_started_ = false;
  graph::forward(graph_ops, sizes_, layout_, weights(params), arena_, casting);
  logits_valid_ = true;

  if (!batch.targets) {
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    staging_busy_ = false;
    return std::numeric_limits<float>::quiet_NaN();
  }
  enqueue_losses(batch);
  upload_embedding_plan(host_inputs, BT);  // while the GPU runs the forward
  return mean_loss(batch);
}

template <class T>
int32_t* CudaBackend<T>::upload_tokens(const TokenBatch& batch) {
  sizes_ = graph::shape_of(config_, batch.batch, batch.seq_len);
  int32_t* host_inputs = staging_ints();
  std::copy_n(batch.inputs, sizes_.rows, host_inputs);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.tokens, host_inputs, sizes_.rows * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  return host_inputs;
}

template <class T>
int32_t* CudaBackend<T>::staging_ints() {
  if (staging_busy_) LAYUP_CUDA_CHECK(cudaEventSynchronize(staging_uploaded_));
  staging_busy_ = false;
  return host_ints_;
}

template <class T>
void CudaBackend<T>::staging_queued() {
  LAYUP_CUDA_CHECK(cudaEventRecord(staging_uploaded_, stream_));
  staging_busy_ = true;
}

template <class T>
void CudaBackend<T>::upload_embedding_plan(const int32_t* host_inputs, int BT) {
  const cuda::EmbeddingBackwardPlan plan = cuda::make_embedding_backward_plan(host_inputs, BT);
  segments_ = plan.segments();
  // The staging's order: inputs, targets, then these.
  int32_t* host_positions = host_ints_ + 2 * BT;
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
}

template <class T>
void CudaBackend<T>::enqueue_losses(const TokenBatch& batch) {
  const int BT = sizes_.rows;
  int32_t* host_targets = host_ints_ + BT;
  std::copy_n(batch.targets, BT, host_targets);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.targets, host_targets, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  cuda::classifier_forward(arena_.losses, arena_.logsumexp, arena_.logits, arena_.targets, BT,
                           sizes_.V, sizes_.Vp, stream_);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(host_losses_, arena_.losses, BT * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
}

template <class T>
float CudaBackend<T>::mean_loss(const TokenBatch& batch) {
  const int BT = sizes_.rows;
  learned_targets_ = learned_target_count(batch.targets, BT);
  LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  staging_busy_ = false;
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += host_losses_[n];
  order_.loss_computed();
  return learned_targets_ > 0 ? static_cast<float>(total / learned_targets_) : 0.0f;
}

// The layer-major forward (ModelBackend::forward_embeddings): the same uploads as forward's, the
// embeddings into the micro-batch's hidden state, and the tokens parked at once (the blocks of the
// other micro-batches run before this one's head).
template <class T>
void CudaBackend<T>::forward_embeddings(const ParameterPointers& params, const TokenBatch& batch,
                                        void* hidden, void* store, ForwardHooks& hooks) {
  check_batch(params, batch);
  LAYUP_CHECK(recompute_ >= 3 && batch.targets != nullptr,
              "a layer-major forward needs targets (a training step's) and --recompute 3 (each "
              "block's backward computes its forward again from its stored input; this backend "
              "runs --recompute ",
              recompute_, ")");
  int32_t* host_inputs = upload_tokens(batch);
  const int BT = sizes_.rows;
  order_.forward_started(/*layer_major=*/true);
  logits_valid_ = false;
  layer_major_started_ = true;
  CastingHooks casting(*this, params, hooks);
  CudaOps<T> graph_ops = ops();
  graph::forward_embeddings(graph_ops, layout_, weights(params), static_cast<T*>(hidden), casting);
  upload_embedding_plan(host_inputs, BT);
  staging_queued();
  park_tokens(store);
}

template <class T>
void CudaBackend<T>::forward_block(int layer, const ParameterPointers& params, void* hidden,
                                   void* store, ForwardHooks& hooks) {
  LAYUP_CHECK(layer_major_started_ && layer >= 0 && layer < config_.n_layer, "forward_block(",
              layer, ") needs forward_embeddings first and a block of the model");
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(T));
  T* x = static_cast<T*>(hidden);
  // The block's input into the store, in the stream's order before the block overwrites it.
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(store) + at.block_input(layer), x,
                                   static_cast<size_t>(sizes_.rows) * sizes_.C * sizeof(T),
                                   cudaMemcpyDefault, stream_));
  CastingHooks casting(*this, params, hooks);
  CudaOps<T> graph_ops = ops();
  graph::forward_block(graph_ops, sizes_, layout_.block(), layer, weights(params).blocks[layer],
                       arena_, static_cast<const T*>(x), x, casting);
}

template <class T>
float CudaBackend<T>::forward_head(const ParameterPointers& params, const TokenBatch& batch,
                                   const void* hidden, ForwardHooks& hooks) {
  LAYUP_CHECK(layer_major_started_ && batch.targets != nullptr && batch.batch == sizes_.B &&
                  batch.seq_len == sizes_.T,
              "forward_head needs forward_embeddings and the blocks of the same batch first, "
              "with targets");
  // backward_head reads x_L where forward leaves it.
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.residual[config_.n_layer], hidden,
                                   static_cast<size_t>(sizes_.rows) * sizes_.C * sizeof(T),
                                   cudaMemcpyDefault, stream_));
  CastingHooks casting(*this, params, hooks);
  CudaOps<T> graph_ops = ops();
  graph::forward_head(graph_ops, sizes_, layout_, weights(params), arena_, casting);
  logits_valid_ = true;
  staging_ints();  // the targets go where no upload still reads
  enqueue_losses(batch);
  return mean_loss(batch);
}

template <class T>
const float* CudaBackend<T>::logits() const {
  LAYUP_CHECK(logits_valid_, "the CUDA backend's logits are gone: backward_head turns them into ",
              "their gradient in place; read logits() after forward and before the backward");
  const size_t count = static_cast<size_t>(sizes_.rows) * sizes_.Vp;
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
  order_.check_head(
      /*why_once=*/
      " (on the CUDA backend, one forward per backward pass: the head's backward "
      "consumes the logits)");
  // d(mean loss) / d(loss of one learned position), scaled; 0 when none is learned
  const float dloss = learned_targets_ > 0 ? loss_scale / learned_targets_ : 0.0f;
  logits_valid_ = false;  // the head's backward turns them into their gradient, in place
  CudaOps<T> graph_ops = ops();
  graph::backward_head(graph_ops, sizes_, layout_, weights(params), arena_, final_norm_grad,
                       embeddings_grad, dloss);
  order_.head_done();
}

template <class T>
void CudaBackend<T>::backward_block(int layer, const ParameterPointers& params, float* block_grad) {
  order_.check_block(layer);
  CudaOps<T> graph_ops = ops();
  graph::backward_block(graph_ops, sizes_, layout_.block(), layer, weights(params).blocks[layer],
                        block_grad, arena_, recompute_, /*last_kept=*/!order_.resumed());
  order_.block_done(layer);
}

template <class T>
void CudaBackend<T>::backward_embeddings(const ParameterPointers& /*params*/,
                                         float* embeddings_grad) {
  order_.check_embeddings();
  CudaOps<T> graph_ops = ops();
  graph::backward_embeddings(graph_ops, layout_.embeddings(), arena_, embeddings_grad);
  // The logits were consumed by backward_head: another backward needs another forward.
  order_.embeddings_done(/*repeatable=*/false);
}

template <class T>
void CudaBackend<T>::park_micro_batch(void* store, bool with_inputs) {
  order_.check_park();
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(T));
  char* base = static_cast<char*>(store);
  const size_t rows = static_cast<size_t>(sizes_.rows);
  const size_t activation_bytes = rows * sizes_.C * sizeof(T);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(base + at.d_residual, arena_.d_residual, activation_bytes,
                                   cudaMemcpyDefault, stream_));
  if (!with_inputs) return;
  park_tokens(store);
  for (int layer = 0; layer < config_.n_layer; ++layer)
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(base + at.block_input(layer), arena_.residual[layer],
                                     activation_bytes, cudaMemcpyDefault, stream_));
}

template <class T>
void CudaBackend<T>::park_tokens(void* store) {
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(T));
  const size_t rows = static_cast<size_t>(sizes_.rows);
  // The tokens and the embedding backward's grouping of them, in the order the store keeps them.
  auto* ints = reinterpret_cast<int32_t*>(static_cast<char*>(store) + at.tokens);
  const std::array<std::pair<const int32_t*, size_t>, 4> parts = {{{arena_.tokens, rows},
                                                                   {arena_.positions, rows},
                                                                   {arena_.segment_start, rows + 1},
                                                                   {arena_.segment_token, rows}}};
  for (const auto& [from, count] : parts) {
    LAYUP_CUDA_CHECK(
        cudaMemcpyAsync(ints, from, count * sizeof(int32_t), cudaMemcpyDefault, stream_));
    ints += count;
  }
  parked_segments_[store] = segments_;
}

template <class T>
void CudaBackend<T>::resume_micro_batch(const void* store, int layer) {
  // A parked store is the proof of a forward: another micro-batch's backward_embeddings may have
  // ended the backend's own backward since.
  LAYUP_CHECK(layer >= -1 && layer < config_.n_layer && recompute_ >= 3, "resume_micro_batch(",
              layer,
              ") needs a block of the model (or -1: the embeddings) and --recompute 3 (a block's "
              "backward computes its forward again; this backend runs --recompute ",
              recompute_, ")");
  const auto segments = parked_segments_.find(store);
  LAYUP_CHECK(segments != parked_segments_.end(),
              "resume_micro_batch of a store no micro-batch was parked in");
  const MicroBatchStoreLayout at =
      micro_batch_store_layout(config_, max_batch_, max_seq_len_, sizeof(T));
  const char* base = static_cast<const char*>(store);
  const size_t rows = static_cast<size_t>(sizes_.rows);
  const size_t activation_bytes = rows * sizes_.C * sizeof(T);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.d_residual, base + at.d_residual, activation_bytes,
                                   cudaMemcpyDefault, stream_));
  if (layer >= 0) {
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.residual[layer], base + at.block_input(layer),
                                     activation_bytes, cudaMemcpyDefault, stream_));
  } else {
    const auto* ints = reinterpret_cast<const int32_t*>(base + at.tokens);
    const std::array<std::pair<int32_t*, size_t>, 4> parts = {{{arena_.tokens, rows},
                                                               {arena_.positions, rows},
                                                               {arena_.segment_start, rows + 1},
                                                               {arena_.segment_token, rows}}};
    for (const auto& [to, count] : parts) {
      LAYUP_CUDA_CHECK(
          cudaMemcpyAsync(to, ints, count * sizeof(int32_t), cudaMemcpyDefault, stream_));
      ints += count;
    }
    segments_ = segments->second;
  }
  order_.resumed_at(layer);
}

template <class T>
void CudaBackend<T>::start_decode(int max_positions) {
  LAYUP_CHECK(max_positions >= 1, "a key/value cache needs room for a position at least");
  check_sequence_length(config_, max_positions);
  decode_length_ = 0;
  if (decode_max_positions_ == max_positions) return;
  decode_max_positions_ = 0;
  decode_record_.reset();
  decode_cache_.reset();
  decode_rope_.reset();
  const size_t bytes = kv_cache_bytes(config_, max_positions, sizeof(T));
  decode_cache_ = cuda_allocate({MemorySide::kDevice, TensorClass::kActivations,
                                 MemoryKind::kDevice, bytes, "key/value cache"},
                                " of " + std::to_string(max_positions) + " positions");
  LAYUP_CUDA_CHECK(cudaMemset(decode_cache_.get(), 0, bytes));
  decode_record_ = MemoryRecord(accountant_, MemorySide::kDevice, TensorClass::kActivations,
                                MemoryKind::kDevice, bytes);
  if (config_.is_llama()) {
    const int half = config_.head_dim() / 2;
    std::vector<float> inv_freq(half), cos(static_cast<size_t>(max_positions) * half),
        sin(cos.size());
    rope_inverse_frequencies(inv_freq.data(), config_.head_dim(), config_.rope_theta,
                             config_.rope_scaling);
    rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), max_positions, config_.head_dim());
    const size_t table_bytes = cos.size() * sizeof(float);
    decode_rope_ = cuda_allocate({MemorySide::kDevice, TensorClass::kActivations,
                                  MemoryKind::kDevice, 2 * table_bytes, "rotary table"},
                                 " of the key/value cache");
    auto* tables = static_cast<char*>(decode_rope_.get());
    LAYUP_CUDA_CHECK(cudaMemcpy(tables, cos.data(), table_bytes, cudaMemcpyHostToDevice));
    LAYUP_CUDA_CHECK(
        cudaMemcpy(tables + table_bytes, sin.data(), table_bytes, cudaMemcpyHostToDevice));
  }
  decode_max_positions_ = max_positions;
}

template <class T>
const float* CudaBackend<T>::decode(const ParameterPointers& params,
                                    std::span<const int32_t> tokens) {
  LAYUP_CHECK(decode_max_positions_ > 0, "decode needs start_decode first");
  const int count = static_cast<int>(tokens.size());
  LAYUP_CHECK(decode_length_ + count <= decode_max_positions_, "the key/value cache holds ",
              decode_max_positions_, " positions and has ", decode_length_, " in it; ", count,
              " more do not fit");
  const TokenBatch batch{tokens.data(), nullptr, 1, count};
  check_batch(params, batch);
  order_.forward_started(/*layer_major=*/false);
  logits_valid_ = false;
  layer_major_started_ = false;
  sizes_ = graph::shape_of(config_, 1, count);
  std::copy_n(tokens.data(), count, staging_ints());
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(arena_.tokens, host_ints_, count * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  T* keys = static_cast<T*>(decode_cache_.get());
  const size_t half_count =
      kv_cache_bytes(config_, decode_max_positions_, sizeof(T)) / sizeof(T) / 2;
  const size_t table = static_cast<size_t>(decode_max_positions_) * (config_.head_dim() / 2);
  const auto* rope = static_cast<const float*>(decode_rope_.get());
  CudaDecodeOps<T> graph_ops(ops(), sizes_, arena_,
                             {keys, keys + half_count, rope, rope ? rope + table : nullptr,
                              decode_max_positions_, decode_length_},
                             stream_);
  struct NoHooks final : ForwardHooks {};
  NoHooks no_hooks;
  CastingHooks casting(*this, params, no_hooks);
  graph::forward(graph_ops, sizes_, layout_, weights(params), arena_, casting);
  decode_length_ += count;

  // The last position's logits only.
  const size_t Vp = sizes_.Vp;
  const T* last = arena_.logits + static_cast<size_t>(count - 1) * Vp;
  host_logits_.resize(Vp);
  if constexpr (std::is_same_v<T, float>) {
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(host_logits_.data(), last, Vp * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } else {
    host_logits_raw_.resize(Vp);
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(host_logits_raw_.data(), last, Vp * sizeof(T),
                                     cudaMemcpyDeviceToHost, stream_));
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < Vp; ++i) host_logits_[i] = cuda::to_float(host_logits_raw_[i]);
  }
  return host_logits_.data();
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
