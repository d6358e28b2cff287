// Conversion between layup's flat parameter buffer and Hugging Face's checkpoint files.
#include "io/hf_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace layup {
namespace {

constexpr const char* kHfPrefix = "transformer.";
constexpr const char* kHfLlamaPrefix = "model.";

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

// Writes columns [col_begin, col_end) of the row-major [rows, cols] matrix `source` as rows of
// `destination` (row c - col_begin holds column c), in tiles so that both sides are walked in
// cache-sized pieces.
void transpose_columns(const float* source, size_t rows, size_t cols, size_t col_begin,
                       size_t col_end, float* destination) {
  constexpr size_t kTile = 32;
  for (size_t row_start = 0; row_start < rows; row_start += kTile) {
    for (size_t col_start = col_begin; col_start < col_end; col_start += kTile) {
      const size_t row_end = std::min(rows, row_start + kTile);
      const size_t tile_col_end = std::min(col_end, col_start + kTile);
      for (size_t row = row_start; row < row_end; ++row) {
        for (size_t col = col_start; col < tile_col_end; ++col) {
          destination[(col - col_begin) * rows + row] = source[row * cols + col];
        }
      }
    }
  }
}

// Elements [first, first + out.size()) of the [cols, rows] transpose of the row-major [rows, cols]
// matrix `source`: element d of the transpose is source[(d % rows) * cols + d / rows]. The whole
// rows of the transpose go through transpose_columns, the partial rows at both ends one by one.
void copy_transposed_range(const float* source, size_t rows, size_t cols, size_t first,
                           std::span<float> out) {
  const auto element = [&](size_t d) { return source[(d % rows) * cols + d / rows]; };
  size_t d = first;
  const size_t end = first + out.size();
  float* next = out.data();
  while (d < end && d % rows != 0) *next++ = element(d++);
  const size_t whole_rows = (end - d) / rows;
  if (whole_rows > 0) {
    transpose_columns(source, rows, cols, d / rows, d / rows + whole_rows, next);
    next += whole_rows * rows;
    d += whole_rows * rows;
  }
  while (d < end) *next++ = element(d++);
}

// The tensors with a row per token: HF keeps vocab_size rows, layup padded_vocab_size.
bool has_vocabulary_rows(const TensorSpec& tensor) {
  return tensor.init == TensorInit::kVocabularyNormal;
}

// The name Hugging Face gives a layup tensor: GPT2LMHeadModel's under "transformer.", the Llama
// family's under "model." except its untied head, which sits beside the model.
std::string hf_name(const ModelConfig& config, const std::string& name) {
  if (!config.is_llama()) return kHfPrefix + name;
  return name == "lm_head.weight" ? name : kHfLlamaPrefix + name;
}

// The shape Hugging Face stores a layup tensor in.
std::vector<size_t> hf_shape(const TensorSpec& tensor, const ModelConfig& config) {
  if (has_vocabulary_rows(tensor)) {
    return {static_cast<size_t>(config.vocab_size), static_cast<size_t>(config.n_embd)};
  }
  if (tensor.transposed_in_hf) return {tensor.shape[1], tensor.shape[0]};
  return tensor.shape;
}

// Refuses a tensor holding NaN or infinity, naming the first such element: no trained weight is
// either, and a model holding one produces garbage (or NaN losses) without saying why. `values`
// are elements [first, first + values.size()) of the tensor.
void check_finite(std::span<const float> values, size_t first, const SafetensorsTensorInfo& tensor,
                  const std::string& path) {
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float value) { return !std::isfinite(value); });
  if (bad == values.end()) return;
  const size_t index = first + static_cast<size_t>(bad - values.begin());
  std::ostringstream where;
  where << "element " << index;
  if (tensor.shape.size() == 2) {
    where << " (row " << index / tensor.shape[1] << ", column " << index % tensor.shape[1] << ")";
  }
  fail(path, ": tensor '", tensor.name, "' holds ", *bad, " at ", where.str(),
       "; weights are never NaN or infinite, so the file is damaged or was saved after training "
       "diverged; load an earlier checkpoint");
}

void check_layout_matches(const ModelConfig& config, const ParameterLayout& layout) {
  LAYUP_CHECK(!first_shape_difference(layout.config(), config),
              "internal error: the parameter layout was built for a different model config than "
              "the one being saved");
}

std::string single_file_name(const std::string& base_name) {
  return base_name + ".safetensors";
}

// The weights of a checkpoint directory: model.safetensors, or the index and its shards (or the
// same under another base name).
SafetensorsFileSet open_hf_weights(const std::string& dir,
                                   const std::string& base_name = kHfShardBaseName) {
  const std::string single_name = single_file_name(base_name);
  const std::string index_name = shard_index_file_name(base_name);
  const std::string single_path = join_path(dir, single_name);
  const std::string index_path = join_path(dir, index_name);
  std::error_code error;
  const bool single = std::filesystem::exists(single_path, error);
  const bool sharded = std::filesystem::exists(index_path, error);
  LAYUP_CHECK(!(single && sharded), dir, " holds both ", single_name, " and ", index_name,
              ", two saves of the weights; it is ambiguous which to load: remove the older one");
  if (sharded) return SafetensorsFileSet::open_index(index_path);
  LAYUP_CHECK(single, dir, " holds neither ", single_name, " nor ", index_name,
              "; a model directory needs one of them beside ", kHfConfigFileName);
  return SafetensorsFileSet::open_single(single_path);
}

}  // namespace

std::vector<HfCompanionFile> read_hf_companion_files(const std::string& tokenizer_path,
                                                     const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::vector<HfCompanionFile> files;
  const auto read = [&](const fs::path& path, const std::string& name) {
    const std::vector<std::byte> bytes = read_file_bytes(path.string());
    files.push_back({name, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())});
  };
  std::error_code error;
  if (!tokenizer_path.empty()) {
    fs::path folder = tokenizer_path;
    // A tokenizer.json given as a file travels under that name, with its folder's other files
    // only when it is the folder's own tokenizer.json.
    if (fs::is_regular_file(folder, error)) {
      read(folder, "tokenizer.json");
      folder = folder.filename() == "tokenizer.json" ? folder.parent_path() : fs::path();
    }
    if (!folder.empty())
      for (const char* name : kHfTokenizerFileNames) {
        const bool taken =
            std::any_of(files.begin(), files.end(),
                        [&](const HfCompanionFile& file) { return file.name == name; });
        if (!taken && fs::is_regular_file(folder / name, error)) read(folder / name, name);
      }
  }
  if (!model_dir.empty() &&
      fs::is_regular_file(fs::path(model_dir) / kHfGenerationConfigFileName, error))
    read(fs::path(model_dir) / kHfGenerationConfigFileName, kHfGenerationConfigFileName);
  return files;
}

nlohmann::ordered_json derived_generation_config(const HfConfigExtras& config) {
  nlohmann::ordered_json json;
  // What GenerationConfig.from_model_config marks: nothing was set but the model's own ids.
  json["_from_model_config"] = true;
  for (const auto& [field, ids] : {std::pair{"bos_token_id", &config.bos_token_id},
                                   std::pair{"eos_token_id", &config.eos_token_id},
                                   std::pair{"pad_token_id", &config.pad_token_id}})
    if (!ids->is_null()) json[field] = nlohmann::ordered_json::parse(ids->dump());
  return json;
}

WeightsDtype hf_weights_dtype(const std::string& dir) {
  const SafetensorsFileSet weights = open_hf_weights(dir);
  for (const SafetensorsFileSet::Located& located : weights.tensors())
    if (located.tensor->dtype != "BF16") return WeightsDtype::kFp32;
  return WeightsDtype::kBf16;
}

void save_hf_model(const std::string& dir, const ModelConfig& config, const ParameterLayout& layout,
                   const float* params, const HfFolderExtras& extras) {
  const ReadParams read_params = [params](size_t offset, size_t count, float* out) {
    std::memcpy(out, params + offset, count * sizeof(float));
  };
  save_hf_model_sharded(dir, config, layout, read_params, std::numeric_limits<size_t>::max(),
                        kDefaultStreamChunkBytes, extras);
}

std::vector<SafetensorsTensorShape> hf_tensor_shapes(const ModelConfig& config,
                                                     const ParameterLayout& layout,
                                                     WeightsDtype dtype) {
  const SafetensorsDtype stored =
      dtype == WeightsDtype::kBf16 ? SafetensorsDtype::kBF16 : SafetensorsDtype::kF32;
  std::vector<SafetensorsTensorShape> tensors;
  for (const TensorSpec& spec : layout.tensors())
    tensors.push_back({hf_name(config, spec.name), hf_shape(spec, config), stored});
  return tensors;
}

void write_hf_weights(const std::string& dir, const std::string& base_name,
                      const ModelConfig& config, const ParameterLayout& layout,
                      const ReadParams& read_params, WeightsDtype dtype, size_t max_shard_bytes,
                      size_t chunk_bytes) {
  check_layout_matches(config, layout);
  const std::vector<TensorSpec>& specs = layout.tensors();
  const std::vector<SafetensorsTensorShape> tensors = hf_tensor_shapes(config, layout, dtype);

  const size_t chunk_floats = std::max<size_t>(1, chunk_bytes / sizeof(float));
  // Each element of a transposed matrix comes from a different row of layup's, so the matrix is
  // read whole (in chunks) once, and the writer's chunks are cut from it: the one tensor held.
  std::vector<float> whole_tensor;
  size_t whole_tensor_index = specs.size();
  const TensorRangeSource source = [&](size_t index, size_t first, std::span<float> out) {
    const TensorSpec& spec = specs[index];
    if (!spec.transposed_in_hf) {
      // For the token embedding (and an untied head) these are the first vocab_size rows: the
      // padded rows are simply not written.
      read_params(spec.offset + first, out.size(), out.data());
      return;
    }
    if (whole_tensor_index != index) {
      whole_tensor.resize(spec.count);
      for (size_t start = 0; start < spec.count; start += chunk_floats) {
        read_params(spec.offset + start, std::min(chunk_floats, spec.count - start),
                    whole_tensor.data() + start);
      }
      whole_tensor_index = index;
    }
    copy_transposed_range(whole_tensor.data(), spec.shape[0], spec.shape[1], first, out);
  };

  // transformers refuses safetensors files without this metadata entry.
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const std::string single_path = join_path(dir, single_file_name(base_name));
  const std::string index_path = join_path(dir, shard_index_file_name(base_name));
  const std::vector<SafetensorsShard> plan = plan_shards(tensors, max_shard_bytes, base_name);
  std::vector<std::string> shard_names;
  if (plan.size() == 1) {
    write_streamed_safetensors(single_path, tensors, source, metadata, chunk_bytes);
  } else {
    for (const SafetensorsShard& shard : write_sharded_safetensors(
             dir, base_name, tensors, source, {max_shard_bytes, chunk_bytes, metadata, {}})) {
      shard_names.push_back(shard.file_name);
    }
  }

  // What an earlier save in this directory left: a reader must find one set of weights only. The
  // index goes before its shards, so a reader never sees an index naming a removed shard.
  std::error_code error;
  std::filesystem::remove(plan.size() == 1 ? index_path : single_path, error);
  LAYUP_CHECK(!error, "cannot remove the weights of an earlier save in ", dir, ": ",
              error.message());
  remove_stale_shards(dir, base_name, shard_names);
}

void save_hf_model_sharded(const std::string& dir, const ModelConfig& config,
                           const ParameterLayout& layout, const ReadParams& read_params,
                           size_t max_shard_bytes, size_t chunk_bytes,
                           const HfFolderExtras& extras) {
  validate_config(config);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LAYUP_CHECK(!error, "cannot create the checkpoint directory ", dir, ": ", error.message());
  write_hf_weights(dir, kHfShardBaseName, config, layout, read_params, extras.dtype,
                   max_shard_bytes, chunk_bytes);

  HfConfigExtras config_extras = extras.config;
  config_extras.torch_dtype = extras.dtype == WeightsDtype::kBf16 ? "bfloat16" : "float32";
  const nlohmann::ordered_json config_json = hf_config_json(config, config_extras);
  write_text_atomically(join_path(dir, kHfConfigFileName), config_json.dump(2) + "\n");
  bool has_generation_config = false;
  for (const HfCompanionFile& file : extras.files) {
    write_text_atomically(join_path(dir, file.name), file.bytes);
    has_generation_config |= file.name == kHfGenerationConfigFileName;
  }
  if (!has_generation_config)
    write_text_atomically(
        join_path(dir, kHfGenerationConfigFileName),
        derived_generation_config(parse_hf_config_extras(config_json, kHfConfigFileName)).dump(2) +
            "\n");
}

bool has_hf_weights(const std::string& dir) {
  std::error_code error;
  return std::filesystem::is_regular_file(join_path(dir, kHfWeightsFileName), error) ||
         std::filesystem::is_regular_file(join_path(dir, shard_index_file_name(kHfShardBaseName)),
                                          error);
}

ModelConfig read_hf_model_config(const std::string& dir) {
  LAYUP_CHECK(std::filesystem::is_directory(dir), "cannot load a model from ", dir,
              ": it is not a directory (expected one holding ", kHfConfigFileName, " and ",
              kHfWeightsFileName, " or ", shard_index_file_name(kHfShardBaseName),
              " and its shards)");
  return read_hf_config(join_path(dir, kHfConfigFileName));
}

namespace {

// The file and tensor of each of the layout's tensors in `weights`, and a tied head saved anyway.
struct LocatedWeights {
  std::vector<SafetensorsFileSet::Located> sources;  // one per layout tensor, in its order
  SafetensorsFileSet::Located lm_head;
  size_t largest_transposed = 0;
};

// Finds every tensor of `layout` in `weights` and checks its shape against `config`, and that the
// files hold nothing else, before the first byte is read.
LocatedWeights locate_weights(const SafetensorsFileSet& weights, const ModelConfig& config,
                              const ParameterLayout& layout) {
  const std::string& path = weights.path();
  LocatedWeights found;
  // Every tensor in the files must be one layup knows, or one it may safely ignore.
  std::set<std::string> expected;
  for (const TensorSpec& spec : layout.tensors()) expected.insert(spec.name);
  const std::string prefix = config.is_llama() ? kHfLlamaPrefix : kHfPrefix;
  for (const SafetensorsFileSet::Located& located : weights.tensors()) {
    std::string name = located.tensor->name;
    if (name.starts_with(prefix)) name = name.substr(prefix.size());
    if (expected.count(name)) continue;
    // The causal-mask buffers older transformers versions saved for GPT-2, and the rotary
    // frequencies older Llama files carry: layup builds its own.
    if (!config.is_llama() && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")))
      continue;
    if (config.is_llama() && name.ends_with(".self_attn.rotary_emb.inv_freq")) continue;
    // A tied head saved anyway: accepted if it is the embedding, checked while streaming.
    if (located.tensor->name == "lm_head.weight" && config.tie_word_embeddings) {
      found.lm_head = located;
      continue;
    }
    fail(located.file->path(), " has a tensor '", located.tensor->name, "' that a ",
         config.hf_model_type, " model with the shape in ", kHfConfigFileName,
         " (layers=", config.n_layer,
         ", tie_word_embeddings=", config.tie_word_embeddings ? "true" : "false",
         ") does not have; the weights and their config.json describe different models (one "
         "was changed or comes from another model folder)");
  }

  size_t missing = 0;
  std::string first_missing;
  for (const TensorSpec& spec : layout.tensors()) {
    const SafetensorsFileSet::Located prefixed = weights.find(hf_name(config, spec.name));
    const SafetensorsFileSet::Located bare = hf_name(config, spec.name) == spec.name
                                                 ? SafetensorsFileSet::Located{}
                                                 : weights.find(spec.name);
    LAYUP_CHECK(!(prefixed.tensor && bare.tensor), path, " has both '",
                prefixed.tensor ? prefixed.tensor->name : "", "' and '", spec.name,
                "'; it is ambiguous which one to load");
    const SafetensorsFileSet::Located located = prefixed.tensor ? prefixed : bare;
    found.sources.push_back(located);
    if (!located.tensor) {
      if (missing++ == 0) first_missing = spec.name;
      continue;
    }
    const std::vector<size_t> shape = hf_shape(spec, config);
    LAYUP_CHECK(located.tensor->shape == shape, located.file->path(), ": tensor '",
                located.tensor->name, "' has shape ", shape_text(located.tensor->shape),
                " but the model in ", kHfConfigFileName, " (n_embd=", config.n_embd,
                ", n_positions=", config.n_positions, ", vocab_size=", config.vocab_size,
                ") needs ", shape_text(shape),
                "; the weights and their config.json describe different models (one was changed "
                "or comes from another model folder)");
    if (spec.transposed_in_hf)
      found.largest_transposed = std::max(found.largest_transposed, spec.count);
  }
  LAYUP_CHECK(missing == 0, path, " has no tensor '", hf_name(config, first_missing), "' (nor '",
              first_missing, "'); ", missing, " of ", layout.tensors().size(),
              " tensors that the model in ", kHfConfigFileName, " needs are missing");
  const size_t rows = config.vocab_size, cols = config.n_embd;
  if (found.lm_head.tensor) {
    LAYUP_CHECK(found.lm_head.tensor->shape == std::vector<size_t>({rows, cols}),
                found.lm_head.file->path(), ": lm_head.weight has shape ",
                shape_text(found.lm_head.tensor->shape), " instead of ", shape_text({rows, cols}));
  }
  return found;
}

}  // namespace

void check_hf_weights(const std::string& dir, const ModelConfig& config) {
  locate_weights(open_hf_weights(dir), config, ParameterLayout(config));
}

void load_hf_model_streamed(const std::string& dir, const ModelConfig& config,
                            const WriteParams& write_params, size_t chunk_bytes) {
  const ModelConfig file_config = read_hf_model_config(dir);
  if (const std::optional<ShapeDifference> difference = first_shape_difference(file_config, config))
    fail(dir, "/", kHfConfigFileName, " says ", difference->field, " ", difference->first,
         " but the run was planned with ", difference->second,
         " from it: the file was changed while layup read it; start again once nothing writes "
         "to it");
  read_hf_weights(dir, kHfShardBaseName, config, write_params, chunk_bytes);
}

bool has_hf_weights_named(const std::string& dir, const std::string& base_name) {
  std::error_code error;
  return std::filesystem::is_regular_file(join_path(dir, single_file_name(base_name)), error) ||
         std::filesystem::is_regular_file(join_path(dir, shard_index_file_name(base_name)), error);
}

void read_hf_weights(const std::string& dir, const std::string& base_name,
                     const ModelConfig& config, const WriteParams& write_params,
                     size_t chunk_bytes) {
  const ParameterLayout layout(config);
  const SafetensorsFileSet weights = open_hf_weights(dir, base_name);
  const LocatedWeights located = locate_weights(weights, config, layout);
  const std::vector<SafetensorsFileSet::Located>& sources = located.sources;
  const SafetensorsFileSet::Located& lm_head = located.lm_head;
  const size_t cols = config.n_embd;

  const size_t chunk_floats = std::max<size_t>(1, chunk_bytes / sizeof(float));
  std::vector<float> chunk(std::min(chunk_floats, layout.total_count()));
  std::vector<float> head_chunk(lm_head.tensor ? chunk.size() : 0);
  std::vector<float> whole_tensor;  // a Conv1D matrix, read whole to be transposed
  whole_tensor.reserve(located.largest_transposed);
  for (size_t index = 0; index < layout.tensors().size(); ++index) {
    const TensorSpec& spec = layout.tensors()[index];
    const SafetensorsTensorInfo& tensor = *sources[index].tensor;
    const SafetensorsReader& file = *sources[index].file;
    if (spec.transposed_in_hf) {
      whole_tensor.resize(tensor.element_count);
      file.read_floats(tensor, 0, whole_tensor);
      check_finite(whole_tensor, 0, tensor, file.path());
      const std::vector<size_t>& hf = tensor.shape;
      for (size_t start = 0; start < spec.count; start += chunk.size()) {
        const std::span<float> piece(chunk.data(), std::min(chunk.size(), spec.count - start));
        copy_transposed_range(whole_tensor.data(), hf[0], hf[1], start, piece);
        write_params(spec.offset + start, piece.size(), piece.data());
      }
      continue;
    }
    // For the token embedding (and an untied head) this is the first vocab_size rows; the
    // padded rows follow as zeros.
    const bool vocabulary_rows = has_vocabulary_rows(spec);
    const bool is_wte = vocabulary_rows && spec.span == SpanKind::kEmbeddings;
    for (size_t start = 0; start < tensor.element_count; start += chunk.size()) {
      const std::span<float> piece(chunk.data(),
                                   std::min(chunk.size(), tensor.element_count - start));
      file.read_floats(tensor, start, piece);
      check_finite(piece, start, tensor, file.path());
      if (is_wte && lm_head.tensor) {
        const std::span<float> head(head_chunk.data(), piece.size());
        lm_head.file->read_floats(*lm_head.tensor, start, head);
        if (std::memcmp(head.data(), piece.data(), piece.size_bytes()) != 0) {
          size_t first = 0;
          while (std::memcmp(&head[first], &piece[first], sizeof(float)) == 0) ++first;
          first += start;
          fail(lm_head.file->path(),
               ": lm_head.weight differs from the token embedding (first at row ", first / cols,
               ", column ", first % cols, ") although ", kHfConfigFileName,
               " ties them (tie_word_embeddings); the weights do not match their config");
        }
      }
      write_params(spec.offset + start, piece.size(), piece.data());
    }
    if (vocabulary_rows) {
      std::fill(chunk.begin(), chunk.end(), 0.0f);
      for (size_t start = tensor.element_count; start < spec.count; start += chunk.size()) {
        write_params(spec.offset + start, std::min(chunk.size(), spec.count - start), chunk.data());
      }
    }
  }
}

LoadedModel load_hf_model(const std::string& dir) {
  LoadedModel model;
  model.config = read_hf_model_config(dir);
  model.params.assign(ParameterLayout(model.config).total_count(), 0.0f);
  float* params = model.params.data();
  load_hf_model_streamed(dir, model.config, [params](size_t offset, size_t count, const float* in) {
    std::memcpy(params + offset, in, count * sizeof(float));
  });
  return model;
}

}  // namespace layup
