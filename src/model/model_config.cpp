// Named GPT-2 and Llama-family configs, Llama-family shapes, and their validation.
#include "model/model_config.h"

#include <type_traits>

#include "core/error.h"

namespace layup {

int pad_vocab_size(int vocab_size) {
  return (vocab_size + 127) / 128 * 128;
}

ModelConfig gpt2_config(int n_layer, int n_head, int n_embd, int n_positions, int vocab_size) {
  ModelConfig config;
  config.n_layer = n_layer;
  config.n_head = n_head;
  config.n_embd = n_embd;
  config.n_positions = n_positions;
  config.vocab_size = vocab_size;
  config.padded_vocab_size = pad_vocab_size(vocab_size);
  return config;
}

ModelConfig llama_config(int n_layer, int n_head, int n_kv_head, int n_embd, int intermediate_size,
                         int n_positions, int vocab_size) {
  ModelConfig config = gpt2_config(n_layer, n_head, n_embd, n_positions, vocab_size);
  config.architecture = Architecture::kLlama;
  config.n_kv_head = n_kv_head;
  config.intermediate_size = intermediate_size;
  config.layer_norm_epsilon = 1e-6f;
  config.tie_word_embeddings = false;
  config.hf_model_type = "llama";
  return config;
}

namespace {

struct NamedConfig {
  const char* name;
  int n_layer, n_head, n_embd, n_positions;
};

// The published GPT-2 sizes, plus "small": 4 layers of width 128 over a 256-token context, sized
// so that a 2-core CPU trains it visibly in about ten minutes (most of its 7M parameters are the
// token embedding, which the full GPT-2 vocabulary makes unavoidable).
constexpr NamedConfig kNamedConfigs[] = {
    {"small", 4, 4, 128, 256},           {"gpt2", 12, 12, 768, 1024},
    {"gpt2-medium", 24, 16, 1024, 1024}, {"gpt2-large", 36, 20, 1280, 1024},
    {"gpt2-xl", 48, 25, 1600, 1024},
};

// Llama 3's rope_scaling as Llama 3.1 and 3.2 publish it (rope_type "llama3").
RopeScaling llama3_rope_scaling() {
  RopeScaling scaling;
  scaling.llama3 = true;
  scaling.factor = 32.0f;
  scaling.low_freq_factor = 1.0f;
  scaling.high_freq_factor = 4.0f;
  scaling.original_max_position_embeddings = 8192;
  return scaling;
}

// The published Llama-family models: the fields of their config.json, set as read_hf_config
// sets them (io/hf_config.cpp), so that a named config and the model's own file agree.
ModelConfig llama_3_2(int n_layer, int n_head, int n_embd) {
  ModelConfig config = llama_config(n_layer, n_head, 8, n_embd, 8192, 131072, 128256);
  config.layer_norm_epsilon = 1e-5f;
  config.rope_theta = 500000.0f;
  config.rope_scaling = llama3_rope_scaling();
  config.tie_word_embeddings = true;
  return config;
}

ModelConfig llama_3_8b() {
  ModelConfig config = llama_config(32, 32, 8, 4096, 14336, 8192, 128256);
  config.layer_norm_epsilon = 1e-5f;
  config.rope_theta = 500000.0f;
  return config;
}

ModelConfig qwen2_5_0_5b() {
  ModelConfig config = llama_config(24, 14, 2, 896, 4864, 32768, 151936);
  config.hf_model_type = "qwen2";
  config.attention_bias = true;  // Qwen2's q, k and v projections; o_proj has none
  config.rope_theta = 1000000.0f;
  config.tie_word_embeddings = true;
  return config;
}

// Mistral 7B v0.1: attention sees the last 4096 positions (longer sequences are refused).
ModelConfig mistral_7b() {
  ModelConfig config = llama_config(32, 32, 8, 4096, 14336, 32768, 32000);
  config.hf_model_type = "mistral";
  config.layer_norm_epsilon = 1e-5f;
  config.sliding_window = 4096;
  return config;
}

// Llama 2 13B: every head its own keys and values, a 32000-token vocabulary, an untied head.
ModelConfig llama_2_13b() {
  ModelConfig config = llama_config(40, 40, 40, 5120, 13824, 4096, 32000);
  config.layer_norm_epsilon = 1e-5f;
  return config;
}

struct NamedLlamaConfig {
  const char* name;
  ModelConfig (*make)();
};

constexpr NamedLlamaConfig kNamedLlamaConfigs[] = {
    {"llama-3.2-1b", [] { return llama_3_2(16, 32, 2048); }},
    {"llama-3.2-3b", [] { return llama_3_2(28, 24, 3072); }},
    {"llama-3-8b", llama_3_8b},
    {"llama-2-13b", llama_2_13b},
    {"qwen2.5-0.5b", qwen2_5_0_5b},
    {"mistral-7b", mistral_7b},
};

}  // namespace

ModelConfig named_config(std::string_view name) {
  for (const NamedConfig& named : kNamedConfigs) {
    if (name == named.name)
      return gpt2_config(named.n_layer, named.n_head, named.n_embd, named.n_positions);
  }
  for (const NamedLlamaConfig& named : kNamedLlamaConfigs)
    if (name == named.name) return named.make();
  std::string known;
  for (const std::string& each : named_config_names()) known += (known.empty() ? "" : ", ") + each;
  fail("unknown model config '", name, "'; known configs: ", known,
       " (or give a Hugging Face model folder or its config.json, or --layers, --heads and "
       "--dim)");
}

std::vector<std::string> named_config_names() {
  std::vector<std::string> names;
  for (const NamedConfig& named : kNamedConfigs) names.emplace_back(named.name);
  for (const NamedLlamaConfig& named : kNamedLlamaConfigs) names.emplace_back(named.name);
  return names;
}

void check_sequence_length(const ModelConfig& config, int seq_len) {
  LAYUP_CHECK(seq_len <= config.n_positions, "sequence length ", seq_len,
              " exceeds the model's context of ", config.n_positions, " positions; use --seq-len ",
              config.n_positions, " or less, or a model with a longer --context");
  LAYUP_CHECK(config.sliding_window == 0 || seq_len <= config.sliding_window, "sequence length ",
              seq_len, " exceeds the model's attention window of ", config.sliding_window,
              " positions (sliding_window), which layup does not implement: ",
              "its attention sees every earlier position; use --seq-len ", config.sliding_window,
              " or less, where both are the same");
}

void validate_config(const ModelConfig& config) {
  // The flags name the fields of an explicit model; a config.json's parser has checked its own
  // fields by their names before.
  LAYUP_CHECK(config.n_layer >= 1, "the model needs at least 1 layer (--layers; got ",
              config.n_layer, ")");
  LAYUP_CHECK(config.n_head >= 1, "the model needs at least 1 attention head (--heads; got ",
              config.n_head, ")");
  LAYUP_CHECK(config.n_embd >= 1, "the model width (--dim) must be positive (got ", config.n_embd,
              ")");
  LAYUP_CHECK(config.n_positions >= 1, "the model context must be positive (got ",
              config.n_positions, ")");
  LAYUP_CHECK(config.vocab_size >= 1, "the vocabulary size must be positive (got ",
              config.vocab_size, ")");
  LAYUP_CHECK(config.is_llama() || config.vocab_size <= 65536, "vocabulary size ",
              config.vocab_size, " is out of range 1..65536 (GPT-2's tokens are stored as uint16)");
  LAYUP_CHECK(config.padded_vocab_size >= config.vocab_size, "padded vocabulary ",
              config.padded_vocab_size, " is smaller than the vocabulary ", config.vocab_size);
  if (!config.is_llama()) {
    LAYUP_CHECK(config.n_embd % config.n_head == 0, "the model width ", config.n_embd,
                " (--dim) is not divisible by its ", config.n_head,
                " attention heads (--heads): each head takes an equal share of the width; give a "
                "--dim that is a multiple of --heads");
    LAYUP_CHECK(config.n_kv_head == 0 && config.head_size == 0 && config.intermediate_size == 0 &&
                    config.tie_word_embeddings && !config.attention_bias &&
                    !config.attention_output_bias && config.sliding_window == 0,
                "internal error: a GPT-2 config with fields of the Llama family set");
    return;
  }
  LAYUP_CHECK(config.n_kv_head >= 0 && config.head_size >= 0 && config.intermediate_size >= 0,
              "internal error: a negative head count or width in a Llama-family config");
  LAYUP_CHECK(config.kv_heads() >= 1 && config.n_head % config.kv_heads() == 0,
              "num_key_value_heads ", config.kv_heads(), " must divide num_attention_heads ",
              config.n_head, " (each key/value head serves the same number of query heads)");
  LAYUP_CHECK(config.head_size > 0 || config.n_embd % config.n_head == 0, "hidden_size ",
              config.n_embd, " is not divisible by num_attention_heads ", config.n_head,
              "; give head_dim");
  LAYUP_CHECK(config.head_dim() % 2 == 0, "the head width ", config.head_dim(),
              " must be even: rotary embeddings turn its two halves as pairs");
  LAYUP_CHECK(config.mlp_width() >= 1, "intermediate_size must be positive (got ",
              config.intermediate_size, ")");
  LAYUP_CHECK(config.rope_theta > 0.0f, "rope_theta must be positive (got ", config.rope_theta,
              ")");
  LAYUP_CHECK(config.layer_norm_epsilon > 0.0f, "rms_norm_eps must be positive (got ",
              config.layer_norm_epsilon, ")");
  LAYUP_CHECK(config.sliding_window >= 0, "sliding_window must not be negative (got ",
              config.sliding_window, ")");
  if (config.rope_scaling.llama3) {
    const RopeScaling& r = config.rope_scaling;
    LAYUP_CHECK(r.factor >= 1.0f && r.low_freq_factor > 0.0f &&
                    r.high_freq_factor > r.low_freq_factor &&
                    r.original_max_position_embeddings >= 1,
                "rope_scaling (llama3) needs factor >= 1, 0 < low_freq_factor < "
                "high_freq_factor and original_max_position_embeddings >= 1 (got factor ",
                r.factor, ", low_freq_factor ", r.low_freq_factor, ", high_freq_factor ",
                r.high_freq_factor, ", original_max_position_embeddings ",
                r.original_max_position_embeddings, ")");
  }
}

std::optional<ShapeDifference> first_shape_difference(const ModelConfig& first,
                                                      const ModelConfig& second) {
  const auto text = [](const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>)
      return std::string(value ? "true" : "false");
    else
      return std::to_string(value);
  };
  const auto differs = [&](const char* field, const auto& a, const auto& b) {
    return a == b ? std::nullopt : std::optional<ShapeDifference>({field, text(a), text(b)});
  };
  if (first.hf_model_type != second.hf_model_type || first.architecture != second.architecture)
    return ShapeDifference{"model_type", first.hf_model_type, second.hf_model_type};
  for (const std::optional<ShapeDifference>& difference :
       {differs("n_layer", first.n_layer, second.n_layer),
        differs("n_head", first.n_head, second.n_head),
        differs("n_embd", first.n_embd, second.n_embd),
        differs("n_positions", first.n_positions, second.n_positions),
        differs("vocab_size", first.vocab_size, second.vocab_size),
        differs("padded_vocab_size", first.padded_vocab_size, second.padded_vocab_size),
        differs("num_key_value_heads", first.kv_heads(), second.kv_heads()),
        differs("head_dim", first.head_dim(), second.head_dim()),
        differs("intermediate_size", first.mlp_width(), second.mlp_width()),
        differs("tie_word_embeddings", first.tie_word_embeddings, second.tie_word_embeddings),
        differs("attention_bias", first.attention_bias, second.attention_bias),
        differs("attention_output_bias", first.attention_output_bias,
                second.attention_output_bias)})
    if (difference) return difference;
  return std::nullopt;
}

long long parameter_count(const ModelConfig& config) {
  const long long C = config.n_embd, V = config.vocab_size;
  if (!config.is_llama()) {
    const long long per_block = 12 * C * C + 13 * C;
    return V * C + config.n_positions * C + config.n_layer * per_block + 2 * C;
  }
  const long long qkv = config.qkv_width(), attention = config.n_head * config.head_dim();
  const long long I = config.mlp_width();
  const long long per_block = 2 * C + qkv * C + (config.attention_bias ? qkv : 0) + attention * C +
                              (config.attention_output_bias ? C : 0) + 3 * I * C;
  return V * C * (config.tie_word_embeddings ? 1 : 2) + config.n_layer * per_block + C;
}

}  // namespace layup
