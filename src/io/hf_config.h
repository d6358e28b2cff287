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

// The config.json contents for `config`, and their parser (`source` names the file in errors).
nlohmann::ordered_json hf_config_json(const ModelConfig& config);
ModelConfig parse_hf_config(const nlohmann::json& json, const std::string& source);

}  // namespace layup
