// Where every parameter lives in one flat fp32 buffer: block-contiguous spans.
//
// The buffer is [embeddings][block 0]...[block L-1][final norm]. Each span is one unit of work
// for the schedules: one gradient slot, one transfer, one CPU AdamW call. Inside a block the
// tensors sit at the same relative offsets for every block, so a block's kernels can be pointed
// at any copy of the block (its span in the full buffer, or a gradient slot).
//
// Matrices are stored [out_features, in_features] row-major (y = x W^T + b). Hugging Face's
// GPT-2 stores them the other way round (Conv1D, [in, out]); the checkpoint code transposes.
// The Llama family's tensors are Hugging Face's nn.Linear ones, placed so that what one matmul
// reads is contiguous: q_proj, k_proj, v_proj one after another are the rows of one [q+2kv, C]
// matrix (their biases likewise), gate_proj and up_proj those of one [2I, C] matrix.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace layup {

// The offset of a tensor the model does not have (GPT-2's biases in a Llama, its positions).
inline constexpr size_t kAbsent = std::numeric_limits<size_t>::max();

// Offsets of one block's tensors, relative to the start of the block's span. The names are
// GPT-2's; in the Llama family ln_1 is input_layernorm (RMSNorm: no bias), attn_qkv q/k/v_proj
// stacked (biases in Qwen2 and with Llama's attention_bias), attn_proj o_proj (a bias with Llama's
// attention_bias), ln_2 post_attention_layernorm, mlp_fc gate_proj and up_proj stacked, mlp_proj
// down_proj, these without biases.
struct BlockOffsets {
  size_t ln_1_weight, ln_1_bias;
  size_t attn_qkv_weight, attn_qkv_bias;    // [qkv_width, C], [qkv_width]: q, k, v stacked
  size_t attn_proj_weight, attn_proj_bias;  // [C, n_head head_dim], [C]
  size_t ln_2_weight, ln_2_bias;
  size_t mlp_fc_weight, mlp_fc_bias;      // GPT-2 [4C, C], [4C]; Llama [2I, C]: gate, up
  size_t mlp_proj_weight, mlp_proj_bias;  // [C, I], [C]
  size_t count;                           // floats in one block
};

// Offsets inside the embeddings span.
struct EmbeddingOffsets {
  size_t wte;  // [padded_vocab, C]; also the LM head when tied
  size_t wpe;  // [n_positions, C]; kAbsent in the Llama family (rotary positions)
  size_t count;
};

// Offsets inside the final-norm span: the norm, and an untied LM head (the head's span).
struct FinalNormOffsets {
  size_t weight, bias;  // bias kAbsent under RMSNorm
  size_t lm_head;       // [padded_vocab, C] when the head is not tied, else kAbsent
  size_t count;
};

// How a fresh model fills a tensor (model/init.h).
enum class TensorInit {
  kZeros,             // biases
  kOnes,              // norm gains
  kNormal,            // N(0, 0.02)
  kResidualNormal,    // GPT-2's residual projections: N(0, 0.02 / sqrt(2 n_layer))
  kVocabularyNormal,  // N(0, 0.02) on the real vocabulary's rows, zero on the padding
};

enum class SpanKind { kEmbeddings, kBlock, kFinalNorm };

// One named tensor of the model, placed in the flat buffer.
struct TensorSpec {
  std::string name;           // Hugging Face's name without the "transformer." or "model." prefix
  std::vector<size_t> shape;  // layup's shape (matrices [out, in])
  size_t offset;              // from the start of the whole buffer
  size_t count;
  size_t offset_in_span;  // from the start of its span
  SpanKind span;
  int layer;              // block index, or -1 outside blocks
  bool weight_decay;      // AdamW decays matrices only: not biases, gains or positions
  bool transposed_in_hf;  // stored [in, out] by Hugging Face (Conv1D)
  TensorInit init;
};

// A contiguous range of the flat buffer.
struct Span {
  SpanKind kind;
  int layer;  // block index, or -1
  size_t offset;
  size_t count;
};

// Pointers to the start of each span, wherever the spans live (one buffer or several).
template <class T>
struct SpanPointers {
  T* embeddings = nullptr;
  std::vector<T*> blocks;
  T* final_norm = nullptr;
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const BlockOffsets& block() const { return block_; }
  const EmbeddingOffsets& embeddings() const { return embeddings_; }
  const FinalNormOffsets& final_norm() const { return final_norm_; }

  size_t embeddings_offset() const { return 0; }
  size_t block_offset(int layer) const { return embeddings_.count + layer * block_.count; }
  size_t final_norm_offset() const { return block_offset(config_.n_layer); }
  size_t total_count() const { return final_norm_offset() + final_norm_.count; }

  // Spans in buffer order: embeddings, blocks 0..L-1, final norm.
  const std::vector<Span>& spans() const { return spans_; }
  // Tensors in buffer order.
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The tensors inside one span, in order.
  std::vector<TensorSpec> tensors_in(const Span& span) const;

  // Span pointers into one contiguous buffer laid out as this layout says.
  template <class T>
  SpanPointers<T> pointers(T* base) const {
    SpanPointers<T> result;
    result.embeddings = base + embeddings_offset();
    for (int layer = 0; layer < config_.n_layer; ++layer)
      result.blocks.push_back(base + block_offset(layer));
    result.final_norm = base + final_norm_offset();
    return result;
  }

 private:
  ModelConfig config_;
  BlockOffsets block_;
  EmbeddingOffsets embeddings_;
  FinalNormOffsets final_norm_;
  std::vector<Span> spans_;
  std::vector<TensorSpec> tensors_;
};

}  // namespace layup
