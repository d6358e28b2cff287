// GPT-2 on the CUDA ops: the pre-LN block, the tied LM head, and backward cut at block boundaries.
// The same model and the same sequence of ops as backend/cpu/cpu_backend.cpp:
//
//   x_0 = wte[tokens] + wpe[0:T]
//   block l:  mid = x + c_proj(attention(c_attn(ln_1(x))))
//             x'  = mid + mlp_proj(gelu(mlp_fc(ln_2(mid))))
//   logits = ln_f(x_L) wte^T          (over the padded vocabulary; padded wte rows are zero)
//   loss   = mean over positions of the cross-entropy over the real vocabulary
//
// As on the CPU, a residual add passes its gradient to both summands unchanged, so d_residual_
// serves as the gradient of a block's output and of its branches' outputs at once, and each layer
// norm's input gradient is accumulated into it.
//
// Everything runs on one blocking stream (see cuda_device.h for why blocking). The backend's memory
// is three allocations, one per tensor class (the bf16 compute copy of the weights, always in
// device memory; the activations; the scratch of the backward), each of the kind the placement
// gives it (--place activations=..., scratch=...), each cut into 256-byte aligned pieces
// (cuBLASLt's preferred alignment).
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

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_memory.h"
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
#include "core/error.h"
#include "memory/backend_memory.h"
#include "memory/memory_accountant.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

constexpr size_t kAlignBytes = 256;

size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Hands out aligned pieces of one buffer. Run once with a null base to measure, then again over
// the real allocation: both passes hand out the same offsets.
// The backend's memory regions, one per tensor class it holds.
enum class ArenaRegion { kWeights, kActivations, kScratch };
constexpr int kArenaRegions = 3;
constexpr TensorClass kRegionClass[kArenaRegions] = {
    TensorClass::kWeights, TensorClass::kActivations, TensorClass::kScratch};

// Cuts buffers out of the regions in order, each 256-byte aligned within its region; with null
// bases it only measures.
class Carver {
 public:
  explicit Carver(const std::array<char*, kArenaRegions>& bases) : bases_(bases) {}
  // The region the next takes come from.
  void region(ArenaRegion region) { region_ = static_cast<int>(region); }
  template <class U>
  void take(U*& pointer, size_t count) {
    size_t& used = used_[region_];
    used = align_up(used, kAlignBytes);
    pointer = bases_[region_] ? reinterpret_cast<U*>(bases_[region_] + used) : nullptr;
    used += count * sizeof(U);
  }
  size_t used(int region) const { return used_[region]; }

 private:
  std::array<char*, kArenaRegions> bases_;
  std::array<size_t, kArenaRegions> used_{};
  int region_ = 0;
};

template <class T>
class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(const Gpt2Config& config, int max_batch, int max_seq_len, int recompute,
              std::shared_ptr<MemoryAccountant> accountant, const CudaArenaKinds& kinds,
              AlgorithmChoice algorithms);
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
      return compute_weights_ + compute_span_offsets_.at(span_index);
  }
  void set_compute_copies_current(bool current) override { compute_copies_current_ = current; }

 private:
  // What one transformer block saves in its forward for its backward. Rows are the B*T positions.
  struct BlockActivations {
    T* ln_1;                       // [BT,C]
    float *ln_1_mean, *ln_1_rstd;  // [BT]
    T* qkv;                        // [BT,3C]
    T* att_out;                    // [BT,C] heads merged, before c_proj
    float* att_lse;                // [B,NH,T] log-sum-exp of each score row
    T* residual_mid;               // [BT,C] x + attention branch
    T* ln_2;                       // [BT,C]
    float *ln_2_mean, *ln_2_rstd;  // [BT]
    T* fc;                         // [BT,4C] before GELU
    T* fc_gelu;                    // [BT,4C] after GELU
  };

  enum class BackwardStep { kNeedsForwardWithTargets, kHead, kBlock, kEmbeddings };

  void carve(Carver& carver);
  void check_batch(const ParameterPointers& params, const TokenBatch& batch) const;
  // The weights the kernels read: the fp32 spans themselves, or their bf16 compute copy.
  SpanPointers<const T> weights(const ParameterPointers& params) const;
  // bf16 mode: casts span `index` (layout order) of the fp32 weights into the compute copy,
  // unless the schedule wrote the copies with the update (compute_copies_current_).
  void refresh_compute_span(size_t index, const ParameterPointers& params);
  // cuDNN attention where present, except for single-position sequences, which it rejects.
  bool use_cudnn_attention(int seq_len) const { return cudnn_attention_ && seq_len > 1; }
  void zero(T* buffer, size_t count) {
    LAYUP_CUDA_CHECK(cudaMemsetAsync(buffer, 0, count * sizeof(T), stream_));
  }

  Gpt2Config config_;
  ParameterLayout layout_;
  int max_batch_, max_seq_len_;
  int recompute_;  // see cuda_backend.h
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CublasLt> blas_;
  // bf16 mode: cuDNN's fused attention when this build and machine have it (LAYUP_ATTENTION=layup
  // chooses layup's own kernel); null means layup's kernel. fp32 always uses layup's kernel.
  std::unique_ptr<cuda::CudnnAttention> cudnn_attention_;
  // bf16 mode: the MLP's GELU runs in the matmuls' epilogues (matmul.cuh). fp32, the mode that
  // must match the CPU to 1e-5, keeps the separate GELU op, which computes exactly as the CPU's.
  bool fuse_gelu_ = false;

  // The regions (ArenaRegion order), their sizes and memory kinds.
  std::array<void*, kArenaRegions> arena_{};
  std::array<size_t, kArenaRegions> arena_bytes_{};
  std::array<MemoryKind, kArenaRegions> arena_kinds_{};
  // The ledger the arena, the pinned staging and the workspaces are recorded in (may be null),
  // and their records, which give the bytes back when the backend goes.
  std::shared_ptr<MemoryAccountant> accountant_;
  std::vector<MemoryRecord> memory_records_;

  // The bf16 compute copy of the weights (bf16 mode only), spans at 256-byte aligned offsets.
  T* compute_weights_ = nullptr;
  std::vector<size_t> compute_span_offsets_;  // in layout().spans() order
  // The schedule wrote the copy from the current master weights (ModelBackend::compute_copy):
  // forwards read it without casting.
  bool compute_copies_current_ = false;

  // The last forward's batch: token ids, targets, and the embedding backward's grouping.
  int batch_ = 0, seq_len_ = 0;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  int32_t *positions_ = nullptr, *segment_start_ = nullptr, *segment_token_ = nullptr;
  int segments_ = 0;
  // Pinned host staging for the uploads above and the losses coming back.
  int32_t* host_ints_ = nullptr;  // inputs [BT], targets [BT], positions [BT], starts [BT+1],
                                  // tokens [BT]
  float* host_losses_ = nullptr;  // [BT]

  // Forward activations. residual_[l] is block l's input; residual_[L] is the input of ln_f.
  std::vector<T*> residual_;
  std::vector<BlockActivations> blocks_;
  T* ln_f_ = nullptr;                                  // [BT,C]
  float *ln_f_mean_ = nullptr, *ln_f_rstd_ = nullptr;  // [BT]
  T* logits_ = nullptr;                                // [BT,Vp]; dlogits after backward_head
  float *losses_ = nullptr, *logsumexp_ = nullptr;     // [BT]
  T* branch_out_ = nullptr;  // [BT,C] scratch: a branch before its residual add

  // Backward state: d_residual_ is dL/d(residual stream) where backward has reached; the rest are
  // gradients of one block's intermediates, and scratch for the ops' deterministic reductions.
  T* d_residual_ = nullptr;  // [BT,C]
  T* d_ln_ = nullptr;        // [BT,C]
  T* d_att_out_ = nullptr;   // [BT,C]
  T* d_qkv_ = nullptr;       // [BT,3C]
  T* d_fc_gelu_ = nullptr;   // [BT,4C]
  T* d_fc_ = nullptr;        // [BT,4C]
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;

  bool logits_valid_ = false;
  mutable std::vector<float> host_logits_;
  mutable std::vector<T> host_logits_raw_;  // bf16 mode: the logits as they come off the GPU

  BackwardStep next_step_ = BackwardStep::kNeedsForwardWithTargets;
  int next_layer_ = -1;
};

template <class T>
CudaBackend<T>::CudaBackend(const Gpt2Config& config, int max_batch, int max_seq_len, int recompute,
                            std::shared_ptr<MemoryAccountant> accountant,
                            const CudaArenaKinds& kinds, AlgorithmChoice algorithms)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      recompute_(recompute),
      accountant_(std::move(accountant)) {
  validate_config(config);
  LAYUP_CHECK(recompute >= 0 && recompute <= kMaxRecompute, "--recompute takes 0, 1 or 2, not ",
              recompute);
  LAYUP_CHECK(max_batch >= 1 && max_seq_len >= 1, "the CUDA backend needs a batch size and a ",
              "sequence length of at least 1 (got ", max_batch, " x ", max_seq_len, ")");
  LAYUP_CHECK(max_seq_len <= config.n_positions, "sequence length ", max_seq_len,
              " exceeds the model's context of ", config.n_positions, " positions; use --seq-len ",
              config.n_positions, " or less");
  LAYUP_CHECK(config.head_dim() <= cuda::kMaxAttentionHeadDim, "the CUDA attention kernels take ",
              "head dimensions up to ", cuda::kMaxAttentionHeadDim, "; this model has ",
              config.head_dim(), " (width ", config.n_embd, " over ", config.n_head, " heads)");
  LAYUP_CHECK(static_cast<long long>(max_batch) * config.n_head <= 65535, "batch ", max_batch,
              " x ", config.n_head,
              " heads exceeds the 65535 attention blocks of one grid "
              "dimension; use a smaller --batch");
  std::string why;
  LAYUP_CHECK(cuda_device_available(&why), "cannot use the CUDA backend: ", why);
  blas_ = std::make_unique<cuda::CublasLt>(accountant_, algorithms);

  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  const int C = config.n_embd;
  scratch_floats_ =
      std::max({cuda::matmul_backward_scratch_floats(static_cast<int>(BT), 4 * C),
                cuda::layernorm_backward_scratch_floats(static_cast<int>(BT), C),
                cuda::attention_backward_scratch_floats(max_batch, max_seq_len, config.n_head)});
  if constexpr (!std::is_same_v<T, float>) {
    size_t offset = 0;
    for (const Span& span : layout_.spans()) {
      compute_span_offsets_.push_back(offset);
      offset = align_up(offset + span.count, kAlignBytes / sizeof(T));
    }
  }

  // The carver aligns every buffer to 256 bytes, so only the width decides (matmul_gelu_fusable).
  fuse_gelu_ = !std::is_same_v<T, float> && (4 * C) % 8 == 0;
  Carver measure({});
  carve(measure);
  arena_kinds_ = {MemoryKind::kDevice, kinds.activations, kinds.scratch};
  LAYUP_CUDA_CHECK(cudaStreamCreate(&stream_));  // blocking: see cuda_device.h
  try {
    for (int r = 0; r < kArenaRegions; ++r) {
      arena_bytes_[r] = measure.used(r);
      arena_[r] = cuda_allocate(arena_bytes_[r], arena_kinds_[r],
                                std::string(tensor_class_label(kRegionClass[r])) +
                                    " at B=" + std::to_string(max_batch) +
                                    ", T=" + std::to_string(max_seq_len) +
                                    (std::is_same_v<T, float> ? " (fp32)" : " (bf16)"));
    }
  } catch (...) {
    for (int r = 0; r < kArenaRegions; ++r) cuda_free(arena_[r], arena_kinds_[r]);
    cudaStreamDestroy(stream_);
    throw;
  }
  Carver place({static_cast<char*>(arena_[0]), static_cast<char*>(arena_[1]),
                static_cast<char*>(arena_[2])});
  carve(place);
  // Each region in the ledger under its class and kind; the plan computes the same sizes
  // (memory/backend_memory.h), so a plan that drifted from carve() shows up as a difference in
  // the end-of-run report (and in cuda_memory_test).
  for (int r = 0; r < kArenaRegions; ++r)
    memory_records_.emplace_back(accountant_, MemorySide::kDevice, kRegionClass[r], arena_kinds_[r],
                                 arena_bytes_[r]);
  if constexpr (!std::is_same_v<T, float>) {
    const char* choice = std::getenv("LAYUP_ATTENTION");
    const std::string attention = choice ? choice : "auto";
    LAYUP_CHECK(attention == "auto" || attention == "cudnn" || attention == "layup",
                "LAYUP_ATTENTION must be auto, cudnn or layup, not '", attention, "'");
    std::string why;
    if (attention != "layup" && cuda::CudnnAttention::available(&why)) {
      cudnn_attention_ = std::make_unique<cuda::CudnnAttention>(stream_, accountant_, algorithms);
    } else {
      LAYUP_CHECK(attention != "cudnn",
                  "LAYUP_ATTENTION=cudnn but cuDNN attention is unavailable: ", why);
    }
  }

  const size_t host_ints = 5 * BT + 1;
  LAYUP_CUDA_CHECK(cudaMallocHost(&host_ints_, host_ints * sizeof(int32_t)));
  LAYUP_CUDA_CHECK(cudaMallocHost(&host_losses_, BT * sizeof(float)));
  memory_records_.emplace_back(accountant_, MemorySide::kHost, TensorClass::kScratch,
                               MemoryKind::kPinnedMapped,
                               host_ints * sizeof(int32_t) + BT * sizeof(float));
}

template <class T>
void CudaBackend<T>::carve(Carver& carver) {
  const size_t BT = static_cast<size_t>(max_batch_) * max_seq_len_;
  const size_t C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const size_t Vp = config_.padded_vocab_size;
  if constexpr (!std::is_same_v<T, float>) {
    carver.region(ArenaRegion::kWeights);
    carver.take(compute_weights_, compute_span_offsets_.back() + layout_.spans().back().count);
  }
  carver.region(ArenaRegion::kActivations);
  carver.take(tokens_, BT);
  carver.take(targets_, BT);
  carver.take(positions_, BT);
  carver.take(segment_start_, BT + 1);
  carver.take(segment_token_, BT);

  residual_.resize(L + 1);
  for (T*& residual : residual_) carver.take(residual, BT * C);
  blocks_.resize(L);
  // Recomputed activations live in one buffer that every block's forward writes and its own
  // backward rewrites just before reading (recompute_ >= 1: GELU's output; >= 2: both layer
  // norms' outputs, which are never needed at the same time).
  T *shared_gelu = nullptr, *shared_ln = nullptr;
  if (recompute_ >= 1) carver.take(shared_gelu, BT * 4 * C);
  if (recompute_ >= 2) carver.take(shared_ln, BT * C);
  for (BlockActivations& a : blocks_) {
    if (recompute_ >= 2)
      a.ln_1 = shared_ln;
    else
      carver.take(a.ln_1, BT * C);
    carver.take(a.ln_1_mean, BT);
    carver.take(a.ln_1_rstd, BT);
    carver.take(a.qkv, BT * 3 * C);
    carver.take(a.att_out, BT * C);
    carver.take(a.att_lse, BT * NH);
    carver.take(a.residual_mid, BT * C);
    if (recompute_ >= 2)
      a.ln_2 = shared_ln;
    else
      carver.take(a.ln_2, BT * C);
    carver.take(a.ln_2_mean, BT);
    carver.take(a.ln_2_rstd, BT);
    carver.take(a.fc, BT * 4 * C);
    if (recompute_ >= 1)
      a.fc_gelu = shared_gelu;
    else
      carver.take(a.fc_gelu, BT * 4 * C);
  }
  carver.take(ln_f_, BT * C);
  carver.take(ln_f_mean_, BT);
  carver.take(ln_f_rstd_, BT);
  carver.take(logits_, BT * Vp);
  carver.take(losses_, BT);
  carver.take(logsumexp_, BT);

  carver.region(ArenaRegion::kScratch);
  carver.take(branch_out_, BT * C);

  carver.take(d_residual_, BT * C);
  carver.take(d_ln_, BT * C);
  carver.take(d_att_out_, BT * C);
  carver.take(d_qkv_, BT * 3 * C);
  if (!fuse_gelu_) carver.take(d_fc_gelu_, BT * 4 * C);  // the fused backward needs none
  carver.take(d_fc_, BT * 4 * C);
  carver.take(scratch_, scratch_floats_);
}

template <class T>
CudaBackend<T>::~CudaBackend() {
  // Destructors cannot throw: free what was made and ignore the status.
  if (stream_) cudaStreamSynchronize(stream_);
  cudnn_attention_.reset();  // it works on stream_, which goes below
  cudaFreeHost(host_losses_);
  cudaFreeHost(host_ints_);
  for (int r = 0; r < kArenaRegions; ++r) cuda_free(arena_[r], arena_kinds_[r]);
  if (stream_) cudaStreamDestroy(stream_);
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
      const T* span = compute_weights_ + compute_span_offsets_[i];
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
    cuda::cast_to_bf16(compute_weights_ + compute_span_offsets_[index], master, span.count,
                       stream_);
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
  const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  const float eps = config_.layer_norm_epsilon;
  const BlockOffsets& o = layout_.block();
  const EmbeddingOffsets& e = layout_.embeddings();
  const FinalNormOffsets& f = layout_.final_norm();

  // Host staging: the previous forward synchronized, so its uploads are done.
  int32_t* host_inputs = host_ints_;
  int32_t* host_targets = host_inputs + BT;
  std::copy_n(batch.inputs, BT, host_inputs);
  LAYUP_CUDA_CHECK(
      cudaMemcpyAsync(tokens_, host_inputs, BT * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  const SpanPointers<const T> w = weights(params);
  // Span indices in layout order: embeddings, blocks 0..L-1, final norm.
  const auto block_span = [](int layer) { return static_cast<size_t>(1 + layer); };
  const size_t final_norm_span = static_cast<size_t>(1 + L);

  hooks.before_embeddings();
  refresh_compute_span(0, params);
  cuda::embedding_forward(residual_[0], tokens_, w.embeddings + e.wte, w.embeddings + e.wpe, B, T_,
                          C, stream_);
  // Every layer norm after the first is fused with the residual add before it: block l's ln_2
  // with its attention branch's add, block l+1's ln_1 (or ln_f) with block l's MLP branch's add.
  hooks.before_block(0);
  refresh_compute_span(block_span(0), params);
  cuda::layernorm_forward(blocks_[0].ln_1, blocks_[0].ln_1_mean, blocks_[0].ln_1_rstd, residual_[0],
                          w.blocks[0] + o.ln_1_weight, w.blocks[0] + o.ln_1_bias, BT, C, eps,
                          stream_);
  for (int l = 0; l < L; ++l) {
    const T* p = w.blocks[l];
    BlockActivations& a = blocks_[l];
    const T* x = residual_[l];
    cuda::matmul_forward(*blas_, a.qkv, a.ln_1, p + o.attn_qkv_weight, p + o.attn_qkv_bias, BT, C,
                         3 * C, stream_);
    if (use_cudnn_attention(T_)) {
      if constexpr (!std::is_same_v<T, float>)
        cudnn_attention_->forward(a.att_out, a.att_lse, a.qkv, B, T_, C, NH);
    } else {
      cuda::attention_forward(a.att_out, a.att_lse, a.qkv, B, T_, C, NH, stream_);
    }
    cuda::matmul_forward(*blas_, branch_out_, a.att_out, p + o.attn_proj_weight,
                         p + o.attn_proj_bias, BT, C, C, stream_);
    cuda::residual_layernorm_forward(a.residual_mid, a.ln_2, a.ln_2_mean, a.ln_2_rstd, x,
                                     branch_out_, p + o.ln_2_weight, p + o.ln_2_bias, BT, C, eps,
                                     stream_);
    if (fuse_gelu_) {
      cuda::matmul_gelu_forward(*blas_, a.fc_gelu, a.fc, a.ln_2, p + o.mlp_fc_weight,
                                p + o.mlp_fc_bias, BT, C, 4 * C, stream_);
    } else {
      cuda::matmul_forward(*blas_, a.fc, a.ln_2, p + o.mlp_fc_weight, p + o.mlp_fc_bias, BT, C,
                           4 * C, stream_);
      cuda::gelu_forward(a.fc_gelu, a.fc, BT * 4 * C, stream_);
    }
    cuda::matmul_forward(*blas_, branch_out_, a.fc_gelu, p + o.mlp_proj_weight, p + o.mlp_proj_bias,
                         BT, 4 * C, C, stream_);
    if (l + 1 < L) {
      hooks.before_block(l + 1);
      refresh_compute_span(block_span(l + 1), params);
      BlockActivations& next = blocks_[l + 1];
      const T* next_p = w.blocks[l + 1];
      cuda::residual_layernorm_forward(residual_[l + 1], next.ln_1, next.ln_1_mean, next.ln_1_rstd,
                                       a.residual_mid, branch_out_, next_p + o.ln_1_weight,
                                       next_p + o.ln_1_bias, BT, C, eps, stream_);
    } else {
      hooks.before_head();
      refresh_compute_span(final_norm_span, params);
      cuda::residual_layernorm_forward(residual_[L], ln_f_, ln_f_mean_, ln_f_rstd_, a.residual_mid,
                                       branch_out_, w.final_norm + f.weight, w.final_norm + f.bias,
                                       BT, C, eps, stream_);
    }
  }
  cuda::matmul_forward(*blas_, logits_, ln_f_, w.embeddings + e.wte, static_cast<const T*>(nullptr),
                       BT, C, Vp, stream_);
  logits_valid_ = true;

  if (!batch.targets) {
    next_step_ = BackwardStep::kNeedsForwardWithTargets;
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::numeric_limits<float>::quiet_NaN();
  }
  std::copy_n(batch.targets, BT, host_targets);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(targets_, host_targets, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  cuda::classifier_forward(losses_, logsumexp_, logits_, targets_, BT, V, Vp, stream_);
  LAYUP_CUDA_CHECK(
      cudaMemcpyAsync(host_losses_, losses_, BT * sizeof(float), cudaMemcpyDeviceToHost, stream_));

  // While the GPU runs the forward: group the positions by token for the embedding backward.
  const cuda::EmbeddingBackwardPlan plan = cuda::make_embedding_backward_plan(host_inputs, BT);
  segments_ = plan.segments();
  int32_t* host_positions = host_targets + BT;
  int32_t* host_starts = host_positions + BT;
  int32_t* host_segment_tokens = host_starts + BT + 1;
  std::copy(plan.positions.begin(), plan.positions.end(), host_positions);
  std::copy(plan.segment_start.begin(), plan.segment_start.end(), host_starts);
  std::copy(plan.segment_token.begin(), plan.segment_token.end(), host_segment_tokens);
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(positions_, host_positions, BT * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(segment_start_, host_starts, (segments_ + 1) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  LAYUP_CUDA_CHECK(cudaMemcpyAsync(segment_token_, host_segment_tokens, segments_ * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));

  LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  double total = 0.0;
  for (int n = 0; n < BT; ++n) total += host_losses_[n];
  next_step_ = BackwardStep::kHead;
  return static_cast<float>(total / BT);
}

template <class T>
const float* CudaBackend<T>::logits() const {
  LAYUP_CHECK(logits_valid_, "the CUDA backend's logits are gone: backward_head turns them into ",
              "their gradient in place; read logits() after forward and before the backward");
  const size_t count = static_cast<size_t>(batch_) * seq_len_ * config_.padded_vocab_size;
  host_logits_.resize(count);
  if constexpr (std::is_same_v<T, float>) {
    LAYUP_CUDA_CHECK(
        cudaMemcpy(host_logits_.data(), logits_, count * sizeof(float), cudaMemcpyDeviceToHost));
  } else {
    host_logits_raw_.resize(count);
    LAYUP_CUDA_CHECK(
        cudaMemcpy(host_logits_raw_.data(), logits_, count * sizeof(T), cudaMemcpyDeviceToHost));
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
  cuda::classifier_backward(logits_, logits_, logsumexp_, targets_, BT, V, Vp, dloss, stream_);
  logits_valid_ = false;
  // The head writes the whole embeddings span's gradient (ModelBackend): wte's part here, wpe's
  // zeros below; backward_embeddings adds the input embedding's part to both.
  cuda::matmul_backward(*blas_, d_ln_, embeddings_grad + e.wte, nullptr, logits_, ln_f_,
                        w.embeddings + e.wte, BT, C, Vp, scratch_, cuda::InputGradient::kOverwrite,
                        cuda::WeightGradient::kOverwrite, stream_);
  LAYUP_CUDA_CHECK(cudaMemsetAsync(embeddings_grad + e.wpe, 0,
                                   static_cast<size_t>(config_.n_positions) * C * sizeof(float),
                                   stream_));
  zero(d_residual_, static_cast<size_t>(BT) * C);
  cuda::layernorm_backward(d_residual_, final_norm_grad + f.weight, final_norm_grad + f.bias, d_ln_,
                           residual_[config_.n_layer], w.final_norm + f.weight, ln_f_mean_,
                           ln_f_rstd_, BT, C, cuda::WeightGradient::kOverwrite, scratch_, stream_);
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
  const int B = batch_, T_ = seq_len_, BT = B * T_;
  const int C = config_.n_embd, NH = config_.n_head;
  const BlockOffsets& o = layout_.block();
  const T* p = weights(params).blocks[layer];
  float* g = block_grad;
  const BlockActivations& a = blocks_[layer];

  // MLP branch. d_residual_ holds dL/d(block output) = dL/d(MLP output).
  // --recompute: GELU's output (and the layer norms' below) back into the shared buffers. The
  // recomputed values are the forward's bit for bit where the forward used the same kernel (fp32);
  // in bf16 the forward's GELU ran in the matmul epilogue, so they may differ by a rounding.
  if (recompute_ >= 1) cuda::gelu_forward(a.fc_gelu, a.fc, BT * 4 * C, stream_);
  if (fuse_gelu_) {
    cuda::matmul_backward_through_gelu(
        *blas_, d_fc_, g + o.mlp_proj_weight, g + o.mlp_proj_bias, d_residual_, a.fc_gelu, a.fc,
        p + o.mlp_proj_weight, BT, 4 * C, C, scratch_, cuda::WeightGradient::kOverwrite, stream_);
  } else {
    cuda::matmul_backward(*blas_, d_fc_gelu_, g + o.mlp_proj_weight, g + o.mlp_proj_bias,
                          d_residual_, a.fc_gelu, p + o.mlp_proj_weight, BT, 4 * C, C, scratch_,
                          cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite,
                          stream_);
    zero(d_fc_, static_cast<size_t>(BT) * 4 * C);
    cuda::gelu_backward(d_fc_, a.fc, d_fc_gelu_, BT * 4 * C, stream_);
  }
  if (recompute_ >= 2) {
    cuda::layernorm_forward(a.ln_2, a.ln_2_mean, a.ln_2_rstd, a.residual_mid, p + o.ln_2_weight,
                            p + o.ln_2_bias, BT, C, config_.layer_norm_epsilon, stream_);
  }
  cuda::matmul_backward(*blas_, d_ln_, g + o.mlp_fc_weight, g + o.mlp_fc_bias, d_fc_, a.ln_2,
                        p + o.mlp_fc_weight, BT, C, 4 * C, scratch_,
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, stream_);
  // Adding ln_2's input gradient turns d_residual_ into dL/d(residual_mid).
  cuda::layernorm_backward(d_residual_, g + o.ln_2_weight, g + o.ln_2_bias, d_ln_, a.residual_mid,
                           p + o.ln_2_weight, a.ln_2_mean, a.ln_2_rstd, BT, C,
                           cuda::WeightGradient::kOverwrite, scratch_, stream_);

  // Attention branch. d_residual_ holds dL/d(residual_mid) = dL/d(attention branch output).
  cuda::matmul_backward(*blas_, d_att_out_, g + o.attn_proj_weight, g + o.attn_proj_bias,
                        d_residual_, a.att_out, p + o.attn_proj_weight, BT, C, C, scratch_,
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, stream_);
  if (use_cudnn_attention(T_)) {
    // cuDNN overwrites all of d_qkv_ (dq, dk and dv), so it needs no zeroing.
    if constexpr (!std::is_same_v<T, float>)
      cudnn_attention_->backward(d_qkv_, d_att_out_, a.qkv, a.att_out, a.att_lse, B, T_, C, NH);
  } else {
    zero(d_qkv_, static_cast<size_t>(BT) * 3 * C);
    cuda::attention_backward(d_qkv_, d_att_out_, a.qkv, a.att_out, a.att_lse, B, T_, C, NH,
                             scratch_, stream_);
  }
  if (recompute_ >= 2) {
    cuda::layernorm_forward(a.ln_1, a.ln_1_mean, a.ln_1_rstd, residual_[layer], p + o.ln_1_weight,
                            p + o.ln_1_bias, BT, C, config_.layer_norm_epsilon, stream_);
  }
  cuda::matmul_backward(*blas_, d_ln_, g + o.attn_qkv_weight, g + o.attn_qkv_bias, d_qkv_, a.ln_1,
                        p + o.attn_qkv_weight, BT, C, 3 * C, scratch_,
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, stream_);
  // Adding ln_1's input gradient turns d_residual_ into dL/d(block input).
  cuda::layernorm_backward(d_residual_, g + o.ln_1_weight, g + o.ln_1_bias, d_ln_, residual_[layer],
                           p + o.ln_1_weight, a.ln_1_mean, a.ln_1_rstd, BT, C,
                           cuda::WeightGradient::kOverwrite, scratch_, stream_);

  next_layer_ = layer - 1;
  if (layer == 0) next_step_ = BackwardStep::kEmbeddings;
}

template <class T>
void CudaBackend<T>::backward_embeddings(const ParameterPointers& /*params*/,
                                         float* embeddings_grad) {
  LAYUP_CHECK(next_step_ == BackwardStep::kEmbeddings,
              "backward_embeddings called before the backward of block 0");
  const EmbeddingOffsets& e = layout_.embeddings();
  cuda::embedding_backward(embeddings_grad + e.wte, embeddings_grad + e.wpe, d_residual_,
                           positions_, segment_start_, segment_token_, segments_, batch_, seq_len_,
                           config_.n_embd, stream_);
  // The logits were consumed by backward_head: another backward needs another forward.
  next_step_ = BackwardStep::kNeedsForwardWithTargets;
}

}  // namespace

const char* compute_dtype_name(ComputeDtype dtype) {
  return dtype == ComputeDtype::kFloat32 ? "fp32" : "bf16";
}

std::unique_ptr<ModelBackend> make_cuda_backend(const Gpt2Config& config, int max_batch,
                                                int max_seq_len, ComputeDtype dtype, int recompute,
                                                std::shared_ptr<MemoryAccountant> accountant,
                                                const CudaArenaKinds& kinds,
                                                AlgorithmChoice algorithms) {
  if (dtype == ComputeDtype::kFloat32)
    return std::make_unique<CudaBackend<float>>(config, max_batch, max_seq_len, recompute,
                                                std::move(accountant), kinds, algorithms);
  return std::make_unique<CudaBackend<__nv_bfloat16>>(config, max_batch, max_seq_len, recompute,
                                                      std::move(accountant), kinds, algorithms);
}

}  // namespace layup
