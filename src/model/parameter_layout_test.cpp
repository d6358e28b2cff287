// Pins the block-contiguous layout: spans tile the buffer, blocks share offsets, counts match
// GPT-2 and the published Llama models.
#include "model/parameter_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace layup {
namespace {

TEST(ParameterLayout, SpansTileTheBufferInOrder) {
  const ParameterLayout layout(named_config("small"));
  size_t next = 0;
  for (const Span& span : layout.spans()) {
    EXPECT_EQ(span.offset, next);
    next += span.count;
  }
  EXPECT_EQ(next, layout.total_count());
  ASSERT_EQ(layout.spans().size(), 2u + layout.config().n_layer);
  EXPECT_EQ(layout.spans().front().kind, SpanKind::kEmbeddings);
  EXPECT_EQ(layout.spans().back().kind, SpanKind::kFinalNorm);
}

TEST(ParameterLayout, TensorsTileEachSpan) {
  const ParameterLayout layout(named_config("small"));
  for (const Span& span : layout.spans()) {
    size_t next = 0;
    for (const TensorSpec& tensor : layout.tensors_in(span)) {
      EXPECT_EQ(tensor.offset_in_span, next) << tensor.name;
      EXPECT_EQ(tensor.offset, span.offset + next) << tensor.name;
      next += tensor.count;
    }
    EXPECT_EQ(next, span.count);
  }
}

TEST(ParameterLayout, Gpt2SmallHas124MParameters) {
  const ModelConfig config = named_config("gpt2");
  EXPECT_EQ(parameter_count(config), 124439808);
  const ParameterLayout layout(config);
  const size_t padding = static_cast<size_t>(config.padded_vocab_size - config.vocab_size) * 768;
  EXPECT_EQ(layout.total_count(), static_cast<size_t>(parameter_count(config)) + padding);
  EXPECT_EQ(config.padded_vocab_size, 50304);
}

TEST(ParameterLayout, WeightDecayOnlyOnMatricesExceptPositions) {
  const ParameterLayout layout(named_config("small"));
  for (const TensorSpec& tensor : layout.tensors()) {
    const bool matrix = tensor.shape.size() == 2 && tensor.name != "wpe.weight";
    EXPECT_EQ(tensor.weight_decay, matrix) << tensor.name;
  }
}

// Llama 3.2 1B (tied, 8 of 32 heads for K/V) and Llama 3 8B (untied) as their config.json gives
// them, with the parameter counts transformers reports for the published models.
ModelConfig llama_3_2_1b() {
  ModelConfig config = llama_config(16, 32, 8, 2048, 8192, 131072, 128256);
  config.tie_word_embeddings = true;
  return config;
}

TEST(ParameterLayout, LlamaFamilyCountsMatchThePublishedModels) {
  EXPECT_EQ(parameter_count(llama_3_2_1b()), 1235814400);
  const ModelConfig llama_3_8b = llama_config(32, 32, 8, 4096, 14336, 8192, 128256);
  EXPECT_EQ(parameter_count(llama_3_8b), 8030261248);
  for (const ModelConfig& config : {llama_3_2_1b(), llama_3_8b}) {
    const ParameterLayout layout(config);
    const size_t padding = static_cast<size_t>(config.padded_vocab_size - config.vocab_size) *
                           config.n_embd * (config.tie_word_embeddings ? 1 : 2);
    EXPECT_EQ(layout.total_count(), static_cast<size_t>(parameter_count(config)) + padding);
  }
}

// The named Llama-family configs: the counts transformers reports for the published models, and
// a layout with no per-position tensor however long their context (131072 for Llama 3.2).
TEST(ParameterLayout, NamedLlamaConfigsHaveThePublishedCounts) {
  const std::pair<const char*, long long> published[] = {
      {"llama-3.2-1b", 1235814400}, {"llama-3.2-3b", 3212749824}, {"llama-3-8b", 8030261248},
      {"qwen2.5-0.5b", 494032768},  {"mistral-7b", 7241732096},   {"llama-2-13b", 13015864320},
  };
  for (const auto& [name, count] : published) {
    const ModelConfig config = named_config(name);
    EXPECT_TRUE(config.is_llama()) << name;
    EXPECT_NO_THROW(validate_config(config)) << name;
    EXPECT_EQ(parameter_count(config), count) << name;
    const ParameterLayout layout(config);
    EXPECT_EQ(layout.embeddings().wpe, kAbsent) << name;
    const size_t padding = static_cast<size_t>(config.padded_vocab_size - config.vocab_size) *
                           config.n_embd * (config.tie_word_embeddings ? 1 : 2);
    EXPECT_EQ(layout.total_count(), static_cast<size_t>(count) + padding) << name;
  }
  EXPECT_EQ(named_config("llama-3.2-1b").n_positions, 131072);
  EXPECT_EQ(named_config("llama-3-8b").n_positions, 8192);
  const std::vector<std::string> names = named_config_names();
  for (const char* name : {"gpt2-xl", "llama-3.2-1b", "llama-3-8b", "qwen2.5-0.5b", "mistral-7b"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
}

TEST(ParameterLayout, LlamaTensorsTileTheirSpansAndStackWhatOneMatmulReads) {
  ModelConfig config = llama_config(2, 4, 2, 32, 48, 64, 300);  // GQA: 2 K/V heads of 8
  config.attention_bias = true;                                 // Qwen2's q, k, v biases
  for (bool tied : {true, false}) {
    config.tie_word_embeddings = tied;
    const ParameterLayout layout(config);
    for (const Span& span : layout.spans()) {
      size_t next = 0;
      for (const TensorSpec& tensor : layout.tensors_in(span)) {
        EXPECT_EQ(tensor.offset_in_span, next) << tensor.name;
        next += tensor.count;
      }
      EXPECT_EQ(next, span.count);
    }
    const BlockOffsets& o = layout.block();
    std::map<std::string, const TensorSpec*> named;
    for (const TensorSpec& tensor : layout.tensors()) named[tensor.name] = &tensor;
    // q (32 rows), k and v (16 each) one after another: the rows of one [64, 32] matrix.
    EXPECT_EQ(named.at("layers.1.self_attn.q_proj.weight")->offset_in_span, o.attn_qkv_weight);
    EXPECT_EQ(named.at("layers.1.self_attn.k_proj.weight")->offset_in_span,
              o.attn_qkv_weight + 32 * 32);
    EXPECT_EQ(named.at("layers.1.self_attn.v_proj.weight")->offset_in_span,
              o.attn_qkv_weight + 48 * 32);
    EXPECT_EQ(named.at("layers.1.self_attn.k_proj.bias")->offset_in_span, o.attn_qkv_bias + 32);
    EXPECT_EQ(named.at("layers.0.mlp.up_proj.weight")->offset_in_span, o.mlp_fc_weight + 48 * 32);
    EXPECT_EQ(o.ln_1_bias, kAbsent);
    EXPECT_EQ(o.mlp_proj_bias, kAbsent);
    EXPECT_EQ(layout.embeddings().wpe, kAbsent);
    EXPECT_EQ(named.count("lm_head.weight"), tied ? 0u : 1u);
    EXPECT_EQ(layout.final_norm().lm_head == kAbsent, tied);
    for (const TensorSpec& tensor : layout.tensors()) {
      EXPECT_EQ(tensor.weight_decay, tensor.shape.size() == 2) << tensor.name;
      EXPECT_FALSE(tensor.transposed_in_hf) << tensor.name;
    }
  }
}

TEST(ModelConfig, RefusesLlamaShapesItCannotRun) {
  ModelConfig config = llama_config(2, 6, 4, 48, 64, 64, 300);  // 4 K/V heads for 6 query heads
  EXPECT_THROW(validate_config(config), Error);
  config.n_kv_head = 3;
  EXPECT_NO_THROW(validate_config(config));
  config.head_size = 7;  // an odd head width has no rotary pairs
  EXPECT_THROW(validate_config(config), Error);
  config.head_size = 0;
  config.rope_scaling.llama3 = true;
  config.rope_scaling.factor = 8.0f;
  config.rope_scaling.high_freq_factor = 0.5f;  // below the low frequency factor
  EXPECT_THROW(validate_config(config), Error);
}

TEST(ModelConfig, RejectsBadShapesAndNames) {
  ModelConfig config = named_config("small");
  config.n_head = 3;  // 128 is not divisible by 3
  EXPECT_THROW(validate_config(config), Error);
  EXPECT_THROW(named_config("gpt5"), Error);
  try {
    named_config("gpt5");
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* name : {"gpt2-medium", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b",
                             "qwen2.5-0.5b", "mistral-7b", "a Hugging Face model folder"})
      EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace layup
