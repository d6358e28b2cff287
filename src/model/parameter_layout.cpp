// Builds the block-contiguous parameter layout and its table of named tensors.
#include "model/parameter_layout.h"

namespace layup {

namespace {

// Hands out consecutive offsets within one span.
class Placer {
 public:
  size_t place(size_t count) {
    const size_t offset = next_;
    next_ += count;
    return offset;
  }
  size_t total() const { return next_; }

 private:
  size_t next_ = 0;
};

}  // namespace

ParameterLayout::ParameterLayout(const ModelConfig& config) : config_(config) {
  const size_t C = config.n_embd, V = config.padded_vocab_size, P = config.n_positions;
  const bool llama = config.is_llama();
  const size_t qkv = config.qkv_width(), attention = size_t{1} * config.n_head * config.head_dim();
  const size_t I = config.mlp_width();

  Placer e;
  embeddings_.wte = e.place(V * C);
  embeddings_.wpe = llama ? kAbsent : e.place(P * C);
  embeddings_.count = e.total();

  Placer b;
  block_.ln_1_weight = b.place(C);
  block_.ln_1_bias = llama ? kAbsent : b.place(C);
  block_.attn_qkv_weight = b.place(qkv * C);
  block_.attn_qkv_bias = llama && !config.attention_bias ? kAbsent : b.place(qkv);
  block_.attn_proj_weight = b.place(C * attention);
  block_.attn_proj_bias = llama && !config.attention_output_bias ? kAbsent : b.place(C);
  block_.ln_2_weight = b.place(C);
  block_.ln_2_bias = llama ? kAbsent : b.place(C);
  block_.mlp_fc_weight = b.place((llama ? 2 : 1) * I * C);
  block_.mlp_fc_bias = llama ? kAbsent : b.place(I);
  block_.mlp_proj_weight = b.place(C * I);
  block_.mlp_proj_bias = llama ? kAbsent : b.place(C);
  block_.count = b.total();

  Placer f;
  final_norm_.weight = f.place(C);
  final_norm_.bias = llama ? kAbsent : f.place(C);
  final_norm_.lm_head = config.tie_word_embeddings ? kAbsent : f.place(V * C);
  final_norm_.count = f.total();

  auto add = [this](std::string name, std::vector<size_t> shape, const Span& span,
                    size_t offset_in_span, bool decay, bool transposed, TensorInit init) {
    size_t count = 1;
    for (size_t dim : shape) count *= dim;
    tensors_.push_back(TensorSpec{std::move(name), std::move(shape), span.offset + offset_in_span,
                                  count, offset_in_span, span.kind, span.layer, decay, transposed,
                                  init});
  };
  using enum TensorInit;

  Span embeddings{SpanKind::kEmbeddings, -1, embeddings_offset(), embeddings_.count};
  spans_.push_back(embeddings);
  add(llama ? "embed_tokens.weight" : "wte.weight", {V, C}, embeddings, embeddings_.wte, true,
      false, kVocabularyNormal);
  if (!llama) add("wpe.weight", {P, C}, embeddings, embeddings_.wpe, false, false, kNormal);

  for (int layer = 0; layer < config.n_layer; ++layer) {
    Span block{SpanKind::kBlock, layer, block_offset(layer), block_.count};
    spans_.push_back(block);
    if (llama) {
      const std::string h = "layers." + std::to_string(layer) + ".";
      const size_t q = attention, kv = size_t{1} * config.kv_heads() * config.head_dim();
      const size_t w = block_.attn_qkv_weight, bias = block_.attn_qkv_bias;
      add(h + "input_layernorm.weight", {C}, block, block_.ln_1_weight, false, false, kOnes);
      add(h + "self_attn.q_proj.weight", {q, C}, block, w, true, false, kNormal);
      add(h + "self_attn.k_proj.weight", {kv, C}, block, w + q * C, true, false, kNormal);
      add(h + "self_attn.v_proj.weight", {kv, C}, block, w + (q + kv) * C, true, false, kNormal);
      if (config.attention_bias) {
        add(h + "self_attn.q_proj.bias", {q}, block, bias, false, false, kZeros);
        add(h + "self_attn.k_proj.bias", {kv}, block, bias + q, false, false, kZeros);
        add(h + "self_attn.v_proj.bias", {kv}, block, bias + q + kv, false, false, kZeros);
      }
      add(h + "self_attn.o_proj.weight", {C, q}, block, block_.attn_proj_weight, true, false,
          kNormal);
      if (config.attention_output_bias)
        add(h + "self_attn.o_proj.bias", {C}, block, block_.attn_proj_bias, false, false, kZeros);
      add(h + "post_attention_layernorm.weight", {C}, block, block_.ln_2_weight, false, false,
          kOnes);
      add(h + "mlp.gate_proj.weight", {I, C}, block, block_.mlp_fc_weight, true, false, kNormal);
      add(h + "mlp.up_proj.weight", {I, C}, block, block_.mlp_fc_weight + I * C, true, false,
          kNormal);
      add(h + "mlp.down_proj.weight", {C, I}, block, block_.mlp_proj_weight, true, false, kNormal);
      continue;
    }
    const std::string h = "h." + std::to_string(layer) + ".";
    add(h + "ln_1.weight", {C}, block, block_.ln_1_weight, false, false, kOnes);
    add(h + "ln_1.bias", {C}, block, block_.ln_1_bias, false, false, kZeros);
    add(h + "attn.c_attn.weight", {3 * C, C}, block, block_.attn_qkv_weight, true, true, kNormal);
    add(h + "attn.c_attn.bias", {3 * C}, block, block_.attn_qkv_bias, false, false, kZeros);
    add(h + "attn.c_proj.weight", {C, C}, block, block_.attn_proj_weight, true, true,
        kResidualNormal);
    add(h + "attn.c_proj.bias", {C}, block, block_.attn_proj_bias, false, false, kZeros);
    add(h + "ln_2.weight", {C}, block, block_.ln_2_weight, false, false, kOnes);
    add(h + "ln_2.bias", {C}, block, block_.ln_2_bias, false, false, kZeros);
    add(h + "mlp.c_fc.weight", {4 * C, C}, block, block_.mlp_fc_weight, true, true, kNormal);
    add(h + "mlp.c_fc.bias", {4 * C}, block, block_.mlp_fc_bias, false, false, kZeros);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, block, block_.mlp_proj_weight, true, true,
        kResidualNormal);
    add(h + "mlp.c_proj.bias", {C}, block, block_.mlp_proj_bias, false, false, kZeros);
  }

  Span final_norm{SpanKind::kFinalNorm, -1, final_norm_offset(), final_norm_.count};
  spans_.push_back(final_norm);
  add(llama ? "norm.weight" : "ln_f.weight", {C}, final_norm, final_norm_.weight, false, false,
      kOnes);
  if (!llama) add("ln_f.bias", {C}, final_norm, final_norm_.bias, false, false, kZeros);
  if (!config.tie_word_embeddings)
    add("lm_head.weight", {V, C}, final_norm, final_norm_.lm_head, true, false, kVocabularyNormal);
}

std::vector<TensorSpec> ParameterLayout::tensors_in(const Span& span) const {
  std::vector<TensorSpec> result;
  for (const TensorSpec& tensor : tensors_) {
    if (tensor.span == span.kind && tensor.layer == span.layer) result.push_back(tensor);
  }
  return result;
}

}  // namespace layup
