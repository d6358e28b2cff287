// Builds the block-contiguous parameter layout and its table of named tensors.
#include "model/parameter_layout.h"

namespace layup {

ParameterLayout::ParameterLayout(const Gpt2Config& config) : config_(config) {
  const size_t C = config.n_embd;
  size_t next = 0;
  auto place = [&next](size_t count) {
    size_t offset = next;
    next += count;
    return offset;
  };

  embeddings_.wte = place(static_cast<size_t>(config.padded_vocab_size) * C);
  embeddings_.wpe = place(static_cast<size_t>(config.n_positions) * C);
  embeddings_.count = next;

  next = 0;
  block_.ln_1_weight = place(C);
  block_.ln_1_bias = place(C);
  block_.attn_qkv_weight = place(3 * C * C);
  block_.attn_qkv_bias = place(3 * C);
  block_.attn_proj_weight = place(C * C);
  block_.attn_proj_bias = place(C);
  block_.ln_2_weight = place(C);
  block_.ln_2_bias = place(C);
  block_.mlp_fc_weight = place(4 * C * C);
  block_.mlp_fc_bias = place(4 * C);
  block_.mlp_proj_weight = place(4 * C * C);
  block_.mlp_proj_bias = place(C);
  block_.count = next;

  next = 0;
  final_norm_.weight = place(C);
  final_norm_.bias = place(C);
  final_norm_.count = next;

  auto add = [this](std::string name, std::vector<size_t> shape, const Span& span,
                    size_t offset_in_span, bool decay, bool transposed) {
    size_t count = 1;
    for (size_t dim : shape) count *= dim;
    tensors_.push_back(TensorSpec{std::move(name), std::move(shape), span.offset + offset_in_span,
                                  count, offset_in_span, span.kind, span.layer, decay, transposed});
  };

  const size_t V = config.padded_vocab_size, P = config.n_positions;
  Span embeddings{SpanKind::kEmbeddings, -1, embeddings_offset(), embeddings_.count};
  spans_.push_back(embeddings);
  add("wte.weight", {V, C}, embeddings, embeddings_.wte, true, false);
  add("wpe.weight", {P, C}, embeddings, embeddings_.wpe, false, false);

  for (int layer = 0; layer < config.n_layer; ++layer) {
    Span block{SpanKind::kBlock, layer, block_offset(layer), block_.count};
    spans_.push_back(block);
    const std::string h = "h." + std::to_string(layer) + ".";
    add(h + "ln_1.weight", {C}, block, block_.ln_1_weight, false, false);
    add(h + "ln_1.bias", {C}, block, block_.ln_1_bias, false, false);
    add(h + "attn.c_attn.weight", {3 * C, C}, block, block_.attn_qkv_weight, true, true);
    add(h + "attn.c_attn.bias", {3 * C}, block, block_.attn_qkv_bias, false, false);
    add(h + "attn.c_proj.weight", {C, C}, block, block_.attn_proj_weight, true, true);
    add(h + "attn.c_proj.bias", {C}, block, block_.attn_proj_bias, false, false);
    add(h + "ln_2.weight", {C}, block, block_.ln_2_weight, false, false);
    add(h + "ln_2.bias", {C}, block, block_.ln_2_bias, false, false);
    add(h + "mlp.c_fc.weight", {4 * C, C}, block, block_.mlp_fc_weight, true, true);
    add(h + "mlp.c_fc.bias", {4 * C}, block, block_.mlp_fc_bias, false, false);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, block, block_.mlp_proj_weight, true, true);
    add(h + "mlp.c_proj.bias", {C}, block, block_.mlp_proj_bias, false, false);
  }

  Span final_norm{SpanKind::kFinalNorm, -1, final_norm_offset(), final_norm_.count};
  spans_.push_back(final_norm);
  add("ln_f.weight", {C}, final_norm, final_norm_.weight, false, false);
  add("ln_f.bias", {C}, final_norm, final_norm_.bias, false, false);
}

std::vector<TensorSpec> ParameterLayout::tensors_in(const Span& span) const {
  std::vector<TensorSpec> result;
  for (const TensorSpec& tensor : tensors_) {
    if (tensor.span == span.kind && tensor.layer == span.layer) result.push_back(tensor);
  }
  return result;
}

}  // namespace layup
