// Hugging Face checkpoints of GPT-2 and the Llama family: a directory holding config.json
// (io/hf_config.h) and the weights, either in model.safetensors or in shards
// model-0000k-of-0000n.safetensors listed by model.safetensors.index.json (see
// sharded_safetensors.h).
//
// save_hf_model writes what transformers' save_pretrained writes (GPT2LMHeadModel,
// LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM), so `from_pretrained(dir)` loads a layup
// model, and load_hf_model reads both layup's directories and the ones on the Hugging Face hub.
// What differs between the two sides, and is converted here:
//   - names: HF prefixes GPT-2's tensors with "transformer." and the Llama family's with "model."
//     (except lm_head); unprefixed names are read too;
//   - GPT-2's Conv1D matrices (attention and MLP weights) are stored [in, out] by HF, [out, in] by
//     layup (the Llama family's nn.Linear ones are [out, in] on both sides);
//   - the token embedding (and an untied LM head) has vocab_size rows in HF, padded_vocab_size in
//     layup: the extra rows are dropped on save and zero-filled on load;
//   - a tied LM head is not written (as save_pretrained does); a file that has one anyway is
//     accepted only if it equals the embedding.
//
// A folder saved with HfFolderExtras can be handed on as it is, as save_pretrained's can: the
// weights in the dtype asked (bf16 or fp32), config.json with the source's special token ids and
// that dtype, the source's tokenizer files as they were, and generation_config.json.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/run_choices.h"
#include "io/hf_config.h"  // config.json, read and written
#include "io/sharded_safetensors.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup {

inline constexpr const char* kHfWeightsFileName = "model.safetensors";
inline constexpr const char* kHfConfigFileName = "config.json";
inline constexpr const char* kHfShardBaseName = "model";  // model-00001-of-00003.safetensors
inline constexpr const char* kHfGenerationConfigFileName = "generation_config.json";

// The dtype of a saved folder's weights (--save-dtype); a run's training state is fp32 always.
enum class WeightsDtype { kFp32, kBf16 };
inline constexpr EnumNames<WeightsDtype, 2> kWeightsDtypeNames = {
    {{WeightsDtype::kFp32, "fp32"}, {WeightsDtype::kBf16, "bf16"}}};

// A file a saved folder carries beside the weights, copied byte for byte.
struct HfCompanionFile {
  std::string name;  // "tokenizer.json", "generation_config.json", ...
  std::string bytes;
};

// What a saved folder holds besides the weights and the model's shape.
struct HfFolderExtras {
  WeightsDtype dtype = WeightsDtype::kFp32;
  HfConfigExtras config;  // the special token ids; torch_dtype follows `dtype`
  // Written as they are; without a generation_config.json among them, one is written as
  // transformers derives it from config.json (its bos, eos and pad ids).
  std::vector<HfCompanionFile> files;
};

// The tokenizer's files a Hugging Face folder may hold, each copied where present: what
// AutoTokenizer.from_pretrained reads (the fast tokenizer.json, the slow ones' files, the chat
// template files newer transformers write apart).
inline constexpr const char* kHfTokenizerFileNames[] = {
    "tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "tokenizer.model",       "vocab.json",
    "merges.txt",        "chat_template.jinja",   "chat_template.json"};

// The files a folder saved from a model of `model_dir` whose tokenizer is `tokenizer_path` carries,
// read now (a run's source may change or go while it trains): the tokenizer's files present in
// `tokenizer_path` (a folder, or a tokenizer.json and the tokenizer files beside it) and
// `model_dir`'s generation_config.json. Either path may be empty: nothing from it.
std::vector<HfCompanionFile> read_hf_companion_files(const std::string& tokenizer_path,
                                                     const std::string& model_dir);

// The generation_config.json transformers writes for a model whose config.json says `config`:
// the special token ids it gives.
nlohmann::ordered_json derived_generation_config(const HfConfigExtras& config);

// The dtype to save a model loaded from `dir` in, by default: bf16 where every weight in it is
// bf16, else fp32 (an fp16 or mixed file loses nothing in fp32).
WeightsDtype hf_weights_dtype(const std::string& dir);

// Reads `count` floats of the flat parameter layout, from `offset` on, into `out`, from wherever
// the parameters live (host memory, a GPU, a file); `count` never exceeds the stream's chunk.
using ReadParams = std::function<void(size_t offset, size_t count, float* out)>;
// Takes `count` floats of the flat layout, from `offset` on; the same bound on `count`.
using WriteParams = std::function<void(size_t offset, size_t count, const float* in)>;

struct LoadedModel {
  ModelConfig config;
  std::vector<float> params;  // laid out as ParameterLayout(config) says, padded rows zero
};

// Writes `dir`/model.safetensors, `dir`/config.json and what `extras` adds (each atomically),
// creating `dir` if needed. `params` is the flat buffer of `layout`, which must have been built
// from `config`.
void save_hf_model(const std::string& dir, const ModelConfig& config, const ParameterLayout& layout,
                   const float* params, const HfFolderExtras& extras = {});

// The tensors of `layout` as a Hugging Face checkpoint holds them, in the order they are written:
// their names, and their shapes transposed where HF keeps a Conv1D, without the padded rows.
std::vector<SafetensorsTensorShape> hf_tensor_shapes(const ModelConfig& config,
                                                     const ParameterLayout& layout,
                                                     WeightsDtype dtype = WeightsDtype::kFp32);

// The same, sharded as save_pretrained(max_shard_size=...) shards: config.json, shards of at most
// `max_shard_bytes` tensor bytes each (a larger tensor alone in one) and the index; a model that
// fits one shard is written as model.safetensors alone, as save_pretrained does. The weights come
// from `read_params` a chunk at a time. Memory held: one chunk of `chunk_bytes`, plus one whole
// tensor while a Conv1D matrix is transposed (the largest is the MLP's [4C, C]: 420 MB at
// C = 5120). The shards and index appear together; weight files of an earlier save in `dir` that
// the new one does not use (model.safetensors, the index, other shards) are removed afterwards.
void save_hf_model_sharded(const std::string& dir, const ModelConfig& config,
                           const ParameterLayout& layout, const ReadParams& read_params,
                           size_t max_shard_bytes, size_t chunk_bytes = kDefaultStreamChunkBytes,
                           const HfFolderExtras& extras = {});

// The weights alone as save_hf_model_sharded writes them, under `base_name` instead of "model"
// (`base_name`.safetensors, or its shards and index), in `dtype`; the files of the other form an
// earlier save left under that name are removed. read_hf_weights reads them back as
// load_hf_model_streamed does, and has_hf_weights_named says whether `dir` holds them.
void write_hf_weights(const std::string& dir, const std::string& base_name,
                      const ModelConfig& config, const ParameterLayout& layout,
                      const ReadParams& read_params, WeightsDtype dtype, size_t max_shard_bytes,
                      size_t chunk_bytes = kDefaultStreamChunkBytes);
void read_hf_weights(const std::string& dir, const std::string& base_name,
                     const ModelConfig& config, const WriteParams& write_params,
                     size_t chunk_bytes = kDefaultStreamChunkBytes);
bool has_hf_weights_named(const std::string& dir, const std::string& base_name);

// Reads a checkpoint directory, single-file or sharded (a directory holding both
// model.safetensors and the index is refused as ambiguous). Throws layup::Error naming the file and
// the first problem: a config this engine cannot run (another model type or activation, ...), a
// missing tensor, a tensor of the wrong shape, a tensor no model of that config has, a
// weight that is NaN or infinite (the first one, by tensor and index), an index that does not
// match its shards (see SafetensorsFileSet).
LoadedModel load_hf_model(const std::string& dir);

// Whether `dir` holds weights load_hf_model would look at: model.safetensors or the index.
bool has_hf_weights(const std::string& dir);

// The config.json of checkpoint directory `dir`, validated as load_hf_model does: what a caller
// reads first to size the memory a streamed load writes into.
ModelConfig read_hf_model_config(const std::string& dir);

// Checks the weights of `dir` against `config` without reading them: every tensor present, of the
// shape the config gives, and no other (what load_hf_model_streamed checks before its first write),
// so a mismatch is refused before a run plans or allocates anything.
void check_hf_weights(const std::string& dir, const ModelConfig& config);

// load_hf_model without one whole-model buffer: writes the parameters to `write_params` tensor by
// tensor, in increasing offsets, each element of the layout exactly once (the padded vocabulary
// rows as zeros), in pieces of at most `chunk_bytes`. `config` must be read_hf_model_config(dir).
// Every tensor's presence and shape is checked before the first write; a NaN, infinity or untied
// LM head is found while streaming, so after such an error part of the caller's memory holds
// the new weights. Memory held: a chunk or two, plus one whole tensor while a Conv1D matrix is
// transposed.
void load_hf_model_streamed(const std::string& dir, const ModelConfig& config,
                            const WriteParams& write_params,
                            size_t chunk_bytes = kDefaultStreamChunkBytes);

}  // namespace layup
