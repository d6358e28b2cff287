// Conversion between layup's flat parameter buffer and Hugging Face's GPT-2 checkpoint files.
#include "io/hf_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace layup {
namespace {

constexpr const char* kHfPrefix = "transformer.";
constexpr int kGpt2EndOfText = 50256;

std::string join_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

std::string shape_text(const std::vector<size_t>& shape) {
  std::ostringstream text;
  text << '[';
  for (size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << ']';
  return text.str();
}

// Copies a row-major [rows, cols] matrix to its [cols, rows] transpose, in tiles so that both
// sides are walked in cache-sized pieces.
void transpose(const float* source, size_t rows, size_t cols, float* destination) {
  constexpr size_t kTile = 32;
  for (size_t row_start = 0; row_start < rows; row_start += kTile) {
    for (size_t col_start = 0; col_start < cols; col_start += kTile) {
      const size_t row_end = std::min(rows, row_start + kTile);
      const size_t col_end = std::min(cols, col_start + kTile);
      for (size_t row = row_start; row < row_end; ++row) {
        for (size_t col = col_start; col < col_end; ++col) {
          destination[col * rows + row] = source[row * cols + col];
        }
      }
    }
  }
}

// The shape Hugging Face stores a layup tensor in.
std::vector<size_t> hf_shape(const TensorSpec& tensor, const Gpt2Config& config) {
  if (tensor.name == "wte.weight") {
    return {static_cast<size_t>(config.vocab_size), static_cast<size_t>(config.n_embd)};
  }
  if (tensor.transposed_in_hf) return {tensor.shape[1], tensor.shape[0]};
  return tensor.shape;
}

// The float's shortest decimal form, as a double: 1e-5f is written "1e-05" as HF writes it,
// not 9.999999747378752e-06, and reads back as the same float.
double shortest_double(float value) {
  char text[64];
  auto [end, error] = std::to_chars(text, text + sizeof(text) - 1, value);
  *end = '\0';
  return std::strtod(text, nullptr);
}

int read_int_field(const nlohmann::json& json, const std::string& field,
                   const std::string& source) {
  LAYUP_CHECK(json.contains(field), source, " has no \"", field,
              "\"; a GPT-2 config.json needs n_layer, n_head, n_embd, n_positions and vocab_size");
  const nlohmann::json& value = json[field];
  LAYUP_CHECK(value.is_number_integer(), source, ": \"", field, "\" is ", value.dump(),
              ", not an integer");
  const int64_t number = value.get<int64_t>();
  LAYUP_CHECK(number >= 0 && number <= (int64_t{1} << 30), source, ": \"", field, "\" is ", number,
              ", out of range");
  return static_cast<int>(number);
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

// Refuses a tensor holding NaN or infinity, naming the first such element: no trained weight is
// either, and a model holding one produces garbage (or NaN losses) without saying why.
void check_finite(std::span<const float> values, const SafetensorsTensorInfo& tensor,
                  const std::string& path) {
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float value) { return !std::isfinite(value); });
  if (bad == values.end()) return;
  const size_t index = static_cast<size_t>(bad - values.begin());
  std::ostringstream where;
  where << "element " << index;
  if (tensor.shape.size() == 2) {
    where << " (row " << index / tensor.shape[1] << ", column " << index % tensor.shape[1] << ")";
  }
  fail(path, ": tensor '", tensor.name, "' holds ", *bad, " at ", where.str(),
       "; weights are never NaN or infinite, so the file is damaged or was saved after training "
       "diverged; load an earlier checkpoint");
}

void check_layout_matches(const Gpt2Config& config, const ParameterLayout& layout) {
  const Gpt2Config& built = layout.config();
  LAYUP_CHECK(built.n_layer == config.n_layer && built.n_head == config.n_head &&
                  built.n_embd == config.n_embd && built.n_positions == config.n_positions &&
                  built.vocab_size == config.vocab_size &&
                  built.padded_vocab_size == config.padded_vocab_size,
              "internal error: the parameter layout was built for a different model config than "
              "the one being saved");
}

}  // namespace

nlohmann::ordered_json hf_config_json(const Gpt2Config& config) {
  const int end_of_text = std::min(kGpt2EndOfText, config.vocab_size - 1);
  nlohmann::ordered_json json;
  json["activation_function"] = "gelu_new";  // GELU, tanh approximation
  json["architectures"] = nlohmann::ordered_json::array({"GPT2LMHeadModel"});
  // layup trains without dropout, so the model it writes has none either.
  json["attn_pdrop"] = 0.0;
  json["bos_token_id"] = end_of_text;
  json["embd_pdrop"] = 0.0;
  json["eos_token_id"] = end_of_text;
  json["initializer_range"] = 0.02;
  json["layer_norm_epsilon"] = shortest_double(config.layer_norm_epsilon);
  json["model_type"] = "gpt2";
  json["n_ctx"] = config.n_positions;
  json["n_embd"] = config.n_embd;
  json["n_head"] = config.n_head;
  json["n_inner"] = nullptr;  // 4 * n_embd
  json["n_layer"] = config.n_layer;
  json["n_positions"] = config.n_positions;
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
  json["torch_dtype"] = "float32";
  json["use_cache"] = true;
  json["vocab_size"] = config.vocab_size;
  // Ignored by transformers; lets layup restore its own layout exactly.
  json["layup"] = {{"format_version", 1}, {"padded_vocab_size", config.padded_vocab_size}};
  return json;
}

Gpt2Config parse_hf_config(const nlohmann::json& json, const std::string& source) {
  LAYUP_CHECK(json.is_object(), source, " is ", json.type_name(),
              " instead of a JSON object with the model's configuration");
  LAYUP_CHECK(json.contains("model_type") && json["model_type"].is_string(), source,
              " has no \"model_type\"; layup reads GPT-2 checkpoints (model_type \"gpt2\")");
  const std::string model_type = json["model_type"].get<std::string>();
  LAYUP_CHECK(model_type == "gpt2", source, " describes a \"", model_type,
              "\" model; layup reads GPT-2 checkpoints only (model_type \"gpt2\")");

  Gpt2Config config;
  config.n_layer = read_int_field(json, "n_layer", source);
  config.n_head = read_int_field(json, "n_head", source);
  config.n_embd = read_int_field(json, "n_embd", source);
  config.n_positions = json.contains("n_positions") ? read_int_field(json, "n_positions", source)
                                                    : read_int_field(json, "n_ctx", source);
  config.vocab_size = read_int_field(json, "vocab_size", source);

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
    config.padded_vocab_size = read_int_field(json["layup"], "padded_vocab_size", source);
  }
  try {
    validate_config(config);
  } catch (const Error& error) {
    fail(source, ": ", error.what());
  }
  return config;
}

Gpt2Config read_hf_config(const std::string& config_path) {
  const std::vector<std::byte> bytes = read_file_bytes(config_path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                 reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  } catch (const nlohmann::json::exception& error) {
    fail(config_path, " is not valid JSON (", error.what(), "); the file is damaged");
  }
  return parse_hf_config(json, config_path);
}

void save_hf_model(const std::string& dir, const Gpt2Config& config, const ParameterLayout& layout,
                   const float* params) {
  validate_config(config);
  check_layout_matches(config, layout);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LAYUP_CHECK(!error, "cannot create the checkpoint directory ", dir, ": ", error.message());

  std::vector<SafetensorsTensor> tensors;
  for (const TensorSpec& spec : layout.tensors()) {
    SafetensorsTensor tensor;
    tensor.name = kHfPrefix + spec.name;
    tensor.shape = hf_shape(spec, config);
    const float* source = params + spec.offset;
    if (spec.transposed_in_hf) {
      const size_t rows = spec.shape[0], cols = spec.shape[1];
      tensor.fill = [source, rows, cols](std::span<float> out) {
        transpose(source, rows, cols, out.data());
      };
    } else {
      // For wte this is the first vocab_size rows: the padded rows are simply not written.
      tensor.data = source;
    }
    tensors.push_back(std::move(tensor));
  }
  // transformers refuses safetensors files without this metadata entry.
  write_safetensors(join_path(dir, kHfWeightsFileName), tensors, {{"format", "pt"}});

  const std::string config_text = hf_config_json(config).dump(2) + "\n";
  write_text_atomically(join_path(dir, kHfConfigFileName), config_text);
}

LoadedModel load_hf_model(const std::string& dir) {
  LAYUP_CHECK(std::filesystem::is_directory(dir), "cannot load a model from ", dir,
              ": it is not a directory (expected one holding ", kHfWeightsFileName, " and ",
              kHfConfigFileName, ")");
  LoadedModel model;
  model.config = read_hf_config(join_path(dir, kHfConfigFileName));
  const Gpt2Config& config = model.config;
  const ParameterLayout layout(config);
  const SafetensorsReader reader(join_path(dir, kHfWeightsFileName));
  const std::string& path = reader.path();

  // Every tensor in the file must be one layup knows, or one it may safely ignore.
  std::set<std::string> expected;
  for (const TensorSpec& spec : layout.tensors()) expected.insert(spec.name);
  const SafetensorsTensorInfo* lm_head = nullptr;
  for (const SafetensorsTensorInfo& tensor : reader.tensors()) {
    std::string name = tensor.name;
    if (name.starts_with(kHfPrefix)) name = name.substr(std::strlen(kHfPrefix));
    if (expected.count(name)) continue;
    // The causal-mask buffers older transformers versions saved; layup builds its own mask.
    if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
    if (tensor.name == "lm_head.weight") {
      lm_head = &tensor;
      continue;
    }
    fail(path, " has a tensor '", tensor.name, "' that a GPT-2 with the shape in ",
         kHfConfigFileName, " (n_layer=", config.n_layer,
         ") does not have; the weights do not match their config.json");
  }

  model.params.assign(layout.total_count(), 0.0f);
  std::vector<float> scratch;
  size_t missing = 0;
  std::string first_missing;
  for (const TensorSpec& spec : layout.tensors()) {
    const SafetensorsTensorInfo* prefixed = reader.find(kHfPrefix + spec.name);
    const SafetensorsTensorInfo* bare = reader.find(spec.name);
    LAYUP_CHECK(!(prefixed && bare), path, " has both '", prefixed ? prefixed->name : "", "' and '",
                spec.name, "'; it is ambiguous which one to load");
    const SafetensorsTensorInfo* tensor = prefixed ? prefixed : bare;
    if (!tensor) {
      if (missing++ == 0) first_missing = kHfPrefix + spec.name;
      continue;
    }
    const std::vector<size_t> shape = hf_shape(spec, config);
    LAYUP_CHECK(tensor->shape == shape, path, ": tensor '", tensor->name, "' has shape ",
                shape_text(tensor->shape), " but the model in ", kHfConfigFileName,
                " (n_embd=", config.n_embd, ", n_positions=", config.n_positions,
                ", vocab_size=", config.vocab_size, ") needs ", shape_text(shape));
    float* destination = model.params.data() + spec.offset;
    if (spec.transposed_in_hf) {
      scratch.resize(tensor->element_count);
      reader.read_floats(tensor->name, scratch);
      check_finite(scratch, *tensor, path);
      transpose(scratch.data(), shape[0], shape[1], destination);
    } else {
      // For wte this fills the first vocab_size rows; the padded rows stay zero.
      const std::span<float> values(destination, tensor->element_count);
      reader.read_floats(tensor->name, values);
      check_finite(values, *tensor, path);
    }
  }
  LAYUP_CHECK(missing == 0, path, " has no tensor '", first_missing, "' (nor '",
              first_missing.substr(std::strlen(kHfPrefix)), "'); ", missing, " of ",
              layout.tensors().size(), " tensors that the model in ", kHfConfigFileName,
              " needs are missing");

  if (lm_head) {
    const size_t rows = config.vocab_size, cols = config.n_embd;
    LAYUP_CHECK(lm_head->shape == std::vector<size_t>({rows, cols}), path,
                ": lm_head.weight has shape ", shape_text(lm_head->shape), " instead of ",
                shape_text({rows, cols}));
    const std::vector<float> head = reader.read_floats(lm_head->name);
    const float* wte = model.params.data() + layout.embeddings().wte;
    if (std::memcmp(head.data(), wte, head.size() * sizeof(float)) != 0) {
      size_t first = 0;
      while (std::memcmp(&head[first], &wte[first], sizeof(float)) == 0) ++first;
      fail(path, ": lm_head.weight differs from the token embedding wte (first at row ",
           first / cols, ", column ", first % cols,
           "); layup supports only GPT-2's tied LM head, not a separately trained one");
    }
  }
  return model;
}

}  // namespace layup
