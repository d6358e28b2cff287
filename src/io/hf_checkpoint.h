// Hugging Face GPT-2 checkpoints: a directory holding model.safetensors and config.json.
//
// save_hf_model writes what transformers' GPT2LMHeadModel.save_pretrained writes, so
// `GPT2LMHeadModel.from_pretrained(dir)` loads a layup model, and load_hf_model reads both layup's
// directories and the ones on the Hugging Face hub (gpt2, gpt2-medium, ...). What differs between
// the two sides, and is converted here:
//   - names: HF prefixes every tensor with "transformer." (older files do not; both are read);
//   - Conv1D matrices (attention and MLP weights) are stored [in, out] by HF, [out, in] by layup;
//   - the token embedding has vocab_size rows in HF, padded_vocab_size in layup: the extra rows are
//     dropped on save and zero-filled on load;
//   - the LM head is tied to the token embedding, so HF files carry no "lm_head.weight"; a file
//     that has one is accepted only if it equals the embedding.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/gpt2_config.h"
#include "model/parameter_layout.h"

namespace layup {

inline constexpr const char* kHfWeightsFileName = "model.safetensors";
inline constexpr const char* kHfConfigFileName = "config.json";

struct LoadedModel {
  Gpt2Config config;
  std::vector<float> params;  // laid out as ParameterLayout(config) says, padded rows zero
};

// Writes `dir`/model.safetensors and `dir`/config.json (each atomically), creating `dir` if
// needed. `params` is the flat buffer of `layout`, which must have been built from `config`.
void save_hf_model(const std::string& dir, const Gpt2Config& config, const ParameterLayout& layout,
                   const float* params);

// Reads a GPT-2 checkpoint directory. Throws layup::Error naming the file and the first problem:
// a config this engine cannot run (not gpt2, another activation, untied head, ...), a missing
// tensor, a tensor of the wrong shape, a tensor no GPT-2 of that config has, a weight that is NaN
// or infinite (the first one, by tensor and index).
LoadedModel load_hf_model(const std::string& dir);

// config.json alone: the model shape, validated as load_hf_model does.
Gpt2Config read_hf_config(const std::string& config_path);

// The config.json contents for `config`, and their parser (`source` names the file in errors).
nlohmann::ordered_json hf_config_json(const Gpt2Config& config);
Gpt2Config parse_hf_config(const nlohmann::json& json, const std::string& source);

}  // namespace layup
