// config.json of a Hugging Face checkpoint: GPT-2's (GPT2LMHeadModel) and the Llama family's
// (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM), read into a ModelConfig and written
// back from one.
//
// What layup cannot run is refused with the field and the reason (another activation, an MLP
// bias, a rope_scaling type other than llama3, dropout, Qwen2's per-layer sliding window), never
// read as something close to it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/model_config.h"

namespace layup {

// config.json alone: the model shape, validated as load_hf_model does.
ModelConfig read_hf_config(const std::string& config_path);

// What config.json says besides the model's shape that a saved folder keeps: the special token
// ids as the source folder gave them (each null for absent, an id, or a list of ids, as Llama 3's
// instruct models give eos_token_id) and the dtype the weights beside it are stored in.
struct HfConfigExtras {
  nlohmann::json bos_token_id, eos_token_id, pad_token_id;
  std::string torch_dtype = "float32";  // "float32" or "bfloat16"
};

// The config.json contents for `config`, and their parser (`source` names the file in errors).
// GPT-2's file says <|endoftext|> for bos and eos where `extras` gives none, as GPT-2's own does.
nlohmann::ordered_json hf_config_json(const ModelConfig& config, const HfConfigExtras& extras = {});
ModelConfig parse_hf_config(const nlohmann::json& json, const std::string& source);

// The special token ids of a config.json (torch_dtype is left at its default): each must be
// absent, null, a non-negative integer or a list of them.
HfConfigExtras parse_hf_config_extras(const nlohmann::json& json, const std::string& source);
HfConfigExtras read_hf_config_extras(const std::string& config_path);

}  // namespace layup
