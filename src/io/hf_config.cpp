// config.json for GPT-2 and the Llama family: parsed, checked, written.
#include "io/hf_config.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {
namespace {

constexpr int kGpt2EndOfText = 50256;
constexpr const char* kGpt2Needs =
    "a GPT-2 config.json needs n_layer, n_head, n_embd, n_positions and vocab_size";

// The float's shortest decimal form, as a double: 1e-5f is written "1e-05" as HF writes it,
// not 9.999999747378752e-06, and reads back as the same float.
double shortest_double(float value) {
  char text[64];
  auto [end, error] = std::to_chars(text, text + sizeof(text) - 1, value);
  *end = '\0';
  return std::strtod(text, nullptr);
}

// `needs` lists the fields the config's family requires, for the message when one is missing.
int read_int_field(const nlohmann::json& json, const std::string& field, const std::string& source,
                   const char* needs) {
  LAYUP_CHECK(json.contains(field), source, " has no \"", field, "\"; ", needs);
  const nlohmann::json& value = json[field];
  LAYUP_CHECK(value.is_number_integer(), source, ": \"", field, "\" is ", value.dump(),
              ", not an integer");
  const int64_t number = value.get<int64_t>();
  LAYUP_CHECK(number >= 0 && number <= (int64_t{1} << 30), source, ": \"", field, "\" is ", number,
              ", out of range");
  return static_cast<int>(number);
}

// A size of the model: a count or a width of at least 1.
int read_size_field(const nlohmann::json& json, const std::string& field, const std::string& source,
                    const char* needs) {
  const int number = read_int_field(json, field, source, needs);
  LAYUP_CHECK(number >= 1, source, ": \"", field, "\" is 0; it must be at least 1");
  return number;
}

// Requires an optional boolean field to be absent, null or equal to `supported`.
void require_flag(const nlohmann::json& json, const std::string& field, bool supported,
                  const std::string& source, const std::string& why) {
  if (!json.contains(field) || json[field].is_null()) return;
  LAYUP_CHECK(json[field].is_boolean(), source, ": \"", field, "\" is ", json[field].dump(),
              ", not true or false");
  LAYUP_CHECK(json[field].get<bool>() == supported, source, ": \"", field, "\" is ",
              json[field].dump(), ", which layup does not support (", why, ")");
}

// An id or list of ids, or null.
nlohmann::ordered_json token_ids(const nlohmann::json& ids) {
  return nlohmann::ordered_json::parse(ids.dump());
}

// `ids`, or `fallback` where they are null.
nlohmann::ordered_json token_ids_or(const nlohmann::json& ids, int fallback) {
  return ids.is_null() ? nlohmann::ordered_json(fallback) : token_ids(ids);
}

nlohmann::ordered_json gpt2_config_json(const ModelConfig& config, const HfConfigExtras& extras) {
  const int end_of_text = std::min(kGpt2EndOfText, config.vocab_size - 1);
  nlohmann::ordered_json json;
  json["activation_function"] = "gelu_new";  // GELU, tanh approximation
  json["architectures"] = nlohmann::ordered_json::array({"GPT2LMHeadModel"});
  // layup trains without dropout, so the model it writes has none either.
  json["attn_pdrop"] = 0.0;
  json["bos_token_id"] = token_ids_or(extras.bos_token_id, end_of_text);
  json["embd_pdrop"] = 0.0;
  json["eos_token_id"] = token_ids_or(extras.eos_token_id, end_of_text);
  json["initializer_range"] = 0.02;
  json["layer_norm_epsilon"] = shortest_double(config.layer_norm_epsilon);
  json["model_type"] = "gpt2";
  json["n_ctx"] = config.n_positions;
  json["n_embd"] = config.n_embd;
  json["n_head"] = config.n_head;
  json["n_inner"] = nullptr;  // 4 * n_embd
  json["n_layer"] = config.n_layer;
  json["n_positions"] = config.n_positions;
  if (!extras.pad_token_id.is_null()) json["pad_token_id"] = token_ids(extras.pad_token_id);
  json["reorder_and_upcast_attn"] = false;
  json["resid_pdrop"] = 0.0;
  json["scale_attn_by_inverse_layer_idx"] = false;
  json["scale_attn_weights"] = true;
  json["summary_activation"] = nullptr;
  json["summary_first_dropout"] = 0.0;
  json["summary_proj_to_labels"] = true;
  json["summary_type"] = "cls_index";
  json["summary_use_proj"] = true;
  json["tie_word_embeddings"] = true;
  json["torch_dtype"] = extras.torch_dtype;
  json["use_cache"] = true;
  json["vocab_size"] = config.vocab_size;
  // Ignored by transformers; lets layup restore its own layout exactly.
  json["layup"] = {{"format_version", 1}, {"padded_vocab_size", config.padded_vocab_size}};
  return json;
}

ModelConfig parse_gpt2_config(const nlohmann::json& json, const std::string& source) {
  ModelConfig config;
  config.n_layer = read_size_field(json, "n_layer", source, kGpt2Needs);
  config.n_head = read_size_field(json, "n_head", source, kGpt2Needs);
  config.n_embd = read_size_field(json, "n_embd", source, kGpt2Needs);
  LAYUP_CHECK(config.n_embd % config.n_head == 0, source, ": \"n_embd\" ", config.n_embd,
              " is not divisible by \"n_head\" ", config.n_head,
              "; each head takes an equal share of the width");
  config.n_positions = json.contains("n_positions")
                           ? read_size_field(json, "n_positions", source, kGpt2Needs)
                           : read_size_field(json, "n_ctx", source, kGpt2Needs);
  config.vocab_size = read_size_field(json, "vocab_size", source, kGpt2Needs);

  if (json.contains("layer_norm_epsilon")) {
    LAYUP_CHECK(json["layer_norm_epsilon"].is_number(), source, ": \"layer_norm_epsilon\" is ",
                json["layer_norm_epsilon"].dump(), ", not a number");
    const double epsilon = json["layer_norm_epsilon"].get<double>();
    LAYUP_CHECK(epsilon > 0 && epsilon < 1, source, ": \"layer_norm_epsilon\" is ", epsilon,
                ", outside (0, 1)");
    config.layer_norm_epsilon = static_cast<float>(epsilon);
  }

  if (json.contains("activation_function")) {
    const nlohmann::json& activation = json["activation_function"];
    const bool tanh_gelu = activation == "gelu_new" || activation == "gelu_pytorch_tanh";
    LAYUP_CHECK(tanh_gelu, source, ": activation_function ", activation.dump(),
                " is not supported; layup's GPT-2 uses the tanh-approximated GELU (\"gelu_new\" "
                "or \"gelu_pytorch_tanh\")");
  }
  if (json.contains("n_inner") && !json["n_inner"].is_null()) {
    LAYUP_CHECK(json["n_inner"].is_number_integer() &&
                    json["n_inner"].get<int64_t>() == 4 * int64_t{config.n_embd},
                source, ": n_inner is ", json["n_inner"].dump(),
                "; layup's GPT-2 has an MLP of width 4 * n_embd = ", 4 * int64_t{config.n_embd},
                " (n_inner null)");
  }
  require_flag(json, "tie_word_embeddings", true, source,
               "the LM head must be tied to the token embedding");
  require_flag(json, "scale_attn_weights", true, source,
               "attention scores are always scaled by 1/sqrt(head_dim)");
  require_flag(json, "scale_attn_by_inverse_layer_idx", false, source,
               "no per-layer attention scaling");
  require_flag(json, "add_cross_attention", false, source, "decoder-only GPT-2 has none");

  config.padded_vocab_size = pad_vocab_size(config.vocab_size);
  if (json.contains("layup") && json["layup"].is_object() &&
      json["layup"].contains("padded_vocab_size")) {
    config.padded_vocab_size =
        read_int_field(json["layup"], "padded_vocab_size", source, kGpt2Needs);
  }
  try {
    validate_config(config);
  } catch (const Error& error) {
    fail(source, ": ", error.what());
  }
  return config;
}

constexpr const char* kLlamaNeeds =
    "a Llama, Qwen2 or Mistral config.json needs hidden_size, intermediate_size, "
    "num_hidden_layers, num_attention_heads, max_position_embeddings and vocab_size";

// An optional number: absent or null gives `fallback`.
double read_number_field(const nlohmann::json& json, const std::string& field, double fallback,
                         const std::string& source) {
  if (!json.contains(field) || json[field].is_null()) return fallback;
  LAYUP_CHECK(json[field].is_number(), source, ": \"", field, "\" is ", json[field].dump(),
              ", not a number");
  return json[field].get<double>();
}

bool read_bool_field(const nlohmann::json& json, const std::string& field, bool fallback,
                     const std::string& source) {
  if (!json.contains(field) || json[field].is_null()) return fallback;
  LAYUP_CHECK(json[field].is_boolean(), source, ": \"", field, "\" is ", json[field].dump(),
              ", not true or false");
  return json[field].get<bool>();
}

// The Hugging Face class of each model_type layup runs in the Llama family.
const char* llama_family_class(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  return nullptr;
}

// The Hugging Face class layup trains for a model_type it reads.
std::string trained_class(const std::string& model_type) {
  return model_type == "gpt2" ? "GPT2LMHeadModel" : llama_family_class(model_type);
}

// `architectures` names the class the weights were saved from: another one (an encoder, a
// classifier) has other tensors and another task even where model_type says gpt2, so it is refused
// rather than loaded as the language model. Absent, null or empty, the file says nothing more.
void check_architectures(const nlohmann::json& json, const std::string& source,
                         const std::string& model_type) {
  if (!json.contains("architectures") || json["architectures"].is_null()) return;
  const nlohmann::json& classes = json["architectures"];
  LAYUP_CHECK(classes.is_array(), source, ": \"architectures\" is ", classes.dump(),
              ", not a list of class names");
  const std::string expected = trained_class(model_type);
  for (const nlohmann::json& name : classes) {
    LAYUP_CHECK(name == expected, source, ": \"architectures\" names ", name.dump(),
                ", a class layup does not train with model_type \"", model_type,
                "\"; layup trains GPT2LMHeadModel (\"gpt2\"), LlamaForCausalLM (\"llama\"), "
                "Qwen2ForCausalLM (\"qwen2\") and MistralForCausalLM (\"mistral\"): give the "
                "config.json of one of those");
  }
}

// `field` is "rope_scaling" (transformers 4: beside rope_theta) or "rope_parameters"
// (transformers 5: rope_theta inside, rope_type "default" for none).
RopeScaling parse_rope_scaling(const nlohmann::json& json, const std::string& field,
                               const std::string& source) {
  RopeScaling scaling;
  if (!json.contains(field) || json[field].is_null()) return scaling;
  const nlohmann::json& r = json[field];
  LAYUP_CHECK(r.is_object(), source, ": \"", field, "\" is ", r.dump(), ", not an object");
  // transformers writes "rope_type"; older files "type".
  const nlohmann::json& type = r.contains("rope_type") ? r["rope_type"] : r["type"];
  LAYUP_CHECK(type.is_string(), source, ": ", field, " ", r.dump(), " names no rope_type");
  if (type == "default") return scaling;
  LAYUP_CHECK(type == "llama3", source, ": ", field, " of type ", type.dump(),
              " is not supported; layup implements Llama 3's (\"llama3\") and none");
  scaling.llama3 = true;
  scaling.factor = static_cast<float>(read_number_field(r, "factor", 0.0, source));
  scaling.low_freq_factor =
      static_cast<float>(read_number_field(r, "low_freq_factor", 0.0, source));
  scaling.high_freq_factor =
      static_cast<float>(read_number_field(r, "high_freq_factor", 0.0, source));
  scaling.original_max_position_embeddings =
      read_int_field(r, "original_max_position_embeddings", source,
                     "a llama3 rope_scaling needs factor, low_freq_factor, high_freq_factor and "
                     "original_max_position_embeddings");
  return scaling;
}

ModelConfig parse_llama_config(const nlohmann::json& json, const std::string& source,
                               const std::string& model_type) {
  ModelConfig config;
  config.architecture = Architecture::kLlama;
  config.hf_model_type = model_type;
  config.n_embd = read_size_field(json, "hidden_size", source, kLlamaNeeds);
  config.intermediate_size = read_size_field(json, "intermediate_size", source, kLlamaNeeds);
  config.n_layer = read_size_field(json, "num_hidden_layers", source, kLlamaNeeds);
  config.n_head = read_size_field(json, "num_attention_heads", source, kLlamaNeeds);
  // Absent or null means one key/value head per query head; 0 would mean no keys at all, not
  // that default (ModelConfig's own 0 does), so it is refused rather than read as the default.
  config.n_kv_head = config.n_head;
  if (json.contains("num_key_value_heads") && !json["num_key_value_heads"].is_null()) {
    config.n_kv_head = read_int_field(json, "num_key_value_heads", source, kLlamaNeeds);
    LAYUP_CHECK(config.n_kv_head >= 1 && config.n_head % config.n_kv_head == 0, source,
                ": \"num_key_value_heads\" is ", config.n_kv_head,
                "; it must be at least 1 and divide \"num_attention_heads\" ", config.n_head,
                " (each key/value head serves the same number of query heads), or be absent for "
                "one per query head");
  }
  config.n_positions = read_size_field(json, "max_position_embeddings", source, kLlamaNeeds);
  config.vocab_size = read_size_field(json, "vocab_size", source, kLlamaNeeds);
  if (json.contains("head_dim") && !json["head_dim"].is_null()) {
    // Not 0 for "hidden_size / num_attention_heads": that is what absent or null says.
    config.head_size = read_size_field(json, "head_dim", source, kLlamaNeeds);
  } else {
    LAYUP_CHECK(config.n_embd % config.n_head == 0, source, ": \"hidden_size\" ", config.n_embd,
                " is not divisible by \"num_attention_heads\" ", config.n_head,
                "; give \"head_dim\", the width of one head");
  }
  config.layer_norm_epsilon =
      static_cast<float>(read_number_field(json, "rms_norm_eps", 1e-6, source));
  if (json.contains("rope_parameters") && !json["rope_parameters"].is_null()) {
    config.rope_scaling = parse_rope_scaling(json, "rope_parameters", source);
    config.rope_theta = static_cast<float>(
        read_number_field(json["rope_parameters"], "rope_theta", 10000.0, source));
  } else {
    config.rope_scaling = parse_rope_scaling(json, "rope_scaling", source);
    config.rope_theta = static_cast<float>(read_number_field(json, "rope_theta", 10000.0, source));
  }
  config.tie_word_embeddings = read_bool_field(json, "tie_word_embeddings", false, source);
  // Qwen2's q, k and v projections always have biases; Llama's attention_bias gives all four
  // projections one, o_proj included.
  const bool llama_bias =
      model_type == "llama" && read_bool_field(json, "attention_bias", false, source);
  config.attention_bias = model_type == "qwen2" || llama_bias;
  config.attention_output_bias = llama_bias;

  if (json.contains("hidden_act")) {
    LAYUP_CHECK(json["hidden_act"] == "silu", source, ": hidden_act ", json["hidden_act"].dump(),
                " is not supported; layup's SwiGLU MLP uses \"silu\"");
  }
  require_flag(json, "mlp_bias", false, source, "the MLP's projections have no biases");
  LAYUP_CHECK(read_number_field(json, "attention_dropout", 0.0, source) == 0.0, source,
              ": attention_dropout is ", json["attention_dropout"].dump(),
              "; layup trains without dropout, so it refuses a model that asks for it");
  LAYUP_CHECK(read_number_field(json, "pretraining_tp", 1.0, source) == 1.0, source,
              ": pretraining_tp is ", json["pretraining_tp"].dump(),
              "; layup runs the exact projections (pretraining_tp 1)");
  if (model_type == "mistral" && json.contains("sliding_window") &&
      !json["sliding_window"].is_null())
    config.sliding_window = read_int_field(json, "sliding_window", source, kLlamaNeeds);
  // Qwen2 applies its window to some layers only, when use_sliding_window is set.
  require_flag(json, "use_sliding_window", false, source,
               "its attention sees every earlier position in every layer");
  if (json.contains("layer_types") && json["layer_types"].is_array())
    for (const nlohmann::json& layer : json["layer_types"])
      LAYUP_CHECK(layer == "full_attention", source, ": layer_types holds ", layer.dump(),
                  "; layup's attention sees every earlier position in every layer "
                  "(\"full_attention\")");

  config.padded_vocab_size = pad_vocab_size(config.vocab_size);
  if (json.contains("layup") && json["layup"].is_object() &&
      json["layup"].contains("padded_vocab_size")) {
    config.padded_vocab_size =
        read_int_field(json["layup"], "padded_vocab_size", source, kLlamaNeeds);
  }
  try {
    validate_config(config);
  } catch (const Error& error) {
    fail(source, ": ", error.what());
  }
  return config;
}

nlohmann::ordered_json llama_config_json(const ModelConfig& config, const HfConfigExtras& extras) {
  const std::string& type = config.hf_model_type;
  nlohmann::ordered_json json;
  json["architectures"] = nlohmann::ordered_json::array({llama_family_class(type)});
  if (type == "llama") json["attention_bias"] = config.attention_bias;
  json["attention_dropout"] = 0.0;
  if (!extras.bos_token_id.is_null()) json["bos_token_id"] = token_ids(extras.bos_token_id);
  if (!extras.eos_token_id.is_null()) json["eos_token_id"] = token_ids(extras.eos_token_id);
  // Qwen2's file has no head_dim (transformers derives it) unless the heads are not an even
  // share of the width.
  if (type != "qwen2" || config.head_dim() * config.n_head != config.n_embd)
    json["head_dim"] = config.head_dim();
  json["hidden_act"] = "silu";
  json["hidden_size"] = config.n_embd;
  json["initializer_range"] = 0.02;
  json["intermediate_size"] = config.mlp_width();
  json["max_position_embeddings"] = config.n_positions;
  if (type == "llama") json["mlp_bias"] = false;
  json["model_type"] = type;
  json["num_attention_heads"] = config.n_head;
  json["num_hidden_layers"] = config.n_layer;
  json["num_key_value_heads"] = config.kv_heads();
  if (!extras.pad_token_id.is_null()) json["pad_token_id"] = token_ids(extras.pad_token_id);
  json["rms_norm_eps"] = shortest_double(config.layer_norm_epsilon);
  if (config.rope_scaling.llama3) {
    const RopeScaling& r = config.rope_scaling;
    json["rope_scaling"] = {
        {"factor", shortest_double(r.factor)},
        {"high_freq_factor", shortest_double(r.high_freq_factor)},
        {"low_freq_factor", shortest_double(r.low_freq_factor)},
        {"original_max_position_embeddings", r.original_max_position_embeddings},
        {"rope_type", "llama3"}};
  } else {
    json["rope_scaling"] = nullptr;
  }
  json["rope_theta"] = shortest_double(config.rope_theta);
  if (type == "mistral")
    json["sliding_window"] =
        config.sliding_window > 0 ? nlohmann::ordered_json(config.sliding_window) : nullptr;
  if (type == "qwen2") json["use_sliding_window"] = false;
  json["tie_word_embeddings"] = config.tie_word_embeddings;
  json["torch_dtype"] = extras.torch_dtype;
  json["use_cache"] = true;
  json["vocab_size"] = config.vocab_size;
  // Ignored by transformers; lets layup restore its own layout exactly.
  json["layup"] = {{"format_version", 1}, {"padded_vocab_size", config.padded_vocab_size}};
  return json;
}

}  // namespace

nlohmann::ordered_json hf_config_json(const ModelConfig& config, const HfConfigExtras& extras) {
  return config.is_llama() ? llama_config_json(config, extras) : gpt2_config_json(config, extras);
}

HfConfigExtras parse_hf_config_extras(const nlohmann::json& json, const std::string& source) {
  const auto is_id = [](const nlohmann::json& id) {
    return id.is_number_integer() && id.get<int64_t>() >= 0;
  };
  const auto read_ids = [&](const char* field) {
    if (!json.is_object() || !json.contains(field)) return nlohmann::json();
    const nlohmann::json& ids = json[field];
    const bool valid = ids.is_null() || is_id(ids) ||
                       (ids.is_array() && std::all_of(ids.begin(), ids.end(), is_id));
    LAYUP_CHECK(valid, source, ": \"", field, "\" is ", ids.dump(),
                "; a token id is a non-negative integer (or a list of them, or null)");
    return ids;
  };
  HfConfigExtras extras;
  extras.bos_token_id = read_ids("bos_token_id");
  extras.eos_token_id = read_ids("eos_token_id");
  extras.pad_token_id = read_ids("pad_token_id");
  return extras;
}

namespace {

nlohmann::json read_json_file(const std::string& path) {
  const std::vector<std::byte> bytes = read_file_bytes(path);
  try {
    return nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                 reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  } catch (const nlohmann::json::exception& error) {
    fail(path, " is not valid JSON (", error.what(), "); the file is damaged");
  }
}

}  // namespace

HfConfigExtras read_hf_config_extras(const std::string& config_path) {
  return parse_hf_config_extras(read_json_file(config_path), config_path);
}

ModelConfig parse_hf_config(const nlohmann::json& json, const std::string& source) {
  LAYUP_CHECK(json.is_object(), source, " is ", json.type_name(),
              " instead of a JSON object with the model's configuration");
  constexpr const char* kKnown =
      "layup reads GPT-2 (model_type \"gpt2\") and the Llama family (\"llama\", \"qwen2\", "
      "\"mistral\")";
  LAYUP_CHECK(json.contains("model_type") && json["model_type"].is_string(), source,
              " has no \"model_type\"; ", kKnown);
  const std::string model_type = json["model_type"].get<std::string>();
  LAYUP_CHECK(model_type == "gpt2" || llama_family_class(model_type) != nullptr, source,
              " describes a \"", model_type, "\" model; ", kKnown);
  check_architectures(json, source, model_type);
  if (model_type == "gpt2") return parse_gpt2_config(json, source);
  return parse_llama_config(json, source, model_type);
}

ModelConfig read_hf_config(const std::string& config_path) {
  return parse_hf_config(read_json_file(config_path), config_path);
}

}  // namespace layup
