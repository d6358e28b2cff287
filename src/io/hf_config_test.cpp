// The Llama family's config.json: the published models' files read into the shape they describe,
// written back and read again unchanged, and every field layup cannot run refused by name.
#include "io/hf_config.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "core/error.h"

namespace layup {
namespace {

// The architecture fields of Llama 3.2 1B's config.json as published.
nlohmann::json llama_3_2_1b() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

// Qwen2.5 0.5B's: q, k and v biases without a field saying so, a tied head.
nlohmann::json qwen2_5_0_5b() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

// Mistral 7B v0.1's: a 4096-position attention window, no head_dim field.
nlohmann::json mistral_7b() {
  return nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "vocab_size": 32000})");
}

// Llama 2 13B's: 40 heads with keys and values of their own, rope_theta 10000, an untied head.
nlohmann::json llama_2_13b() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 5120,
    "intermediate_size": 13824, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 40,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
    "vocab_size": 32000})");
}

// Llama 3.2 3B's: 1B's rope and tied head at width 3072, 24 heads of 128.
nlohmann::json llama_3_2_3b() {
  nlohmann::json file = llama_3_2_1b();
  file["hidden_size"] = 3072;
  file["num_attention_heads"] = 24;
  file["num_hidden_layers"] = 28;
  file["head_dim"] = 128;
  return file;
}

// Llama 3 8B's: no rope_scaling, an 8192-position context, an untied head.
nlohmann::json llama_3_8b() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 128256})");
}

TEST(HfConfig, ReadsTheLlamaFamilyAsPublished) {
  const ModelConfig llama = parse_hf_config(llama_3_2_1b(), "llama/config.json");
  EXPECT_TRUE(llama.is_llama());
  EXPECT_EQ(llama.hf_model_type, "llama");
  EXPECT_EQ(llama.n_layer, 16);
  EXPECT_EQ(llama.n_head, 32);
  EXPECT_EQ(llama.kv_heads(), 8);
  EXPECT_EQ(llama.head_dim(), 64);
  EXPECT_EQ(llama.mlp_width(), 8192);
  EXPECT_EQ(llama.n_positions, 131072);
  EXPECT_EQ(llama.vocab_size, 128256);
  EXPECT_EQ(llama.padded_vocab_size, 128256);  // already a multiple of 128
  EXPECT_FLOAT_EQ(llama.layer_norm_epsilon, 1e-5f);
  EXPECT_FLOAT_EQ(llama.rope_theta, 500000.0f);
  EXPECT_TRUE(llama.rope_scaling.llama3);
  EXPECT_FLOAT_EQ(llama.rope_scaling.factor, 32.0f);
  EXPECT_EQ(llama.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_FALSE(llama.attention_bias);
  EXPECT_EQ(parameter_count(llama), 1235814400);

  const ModelConfig qwen = parse_hf_config(qwen2_5_0_5b(), "qwen/config.json");
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_FALSE(qwen.attention_output_bias);  // o_proj has none in Qwen2
  EXPECT_EQ(qwen.head_dim(), 64);
  EXPECT_EQ(qwen.sliding_window, 0);  // use_sliding_window false: every position
  EXPECT_FALSE(qwen.rope_scaling.llama3);
  EXPECT_EQ(parameter_count(qwen), 494032768);  // Qwen2.5-0.5B's count

  const ModelConfig mistral = parse_hf_config(mistral_7b(), "mistral/config.json");
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_FALSE(mistral.tie_word_embeddings);
  EXPECT_FALSE(mistral.attention_bias);
  EXPECT_EQ(parameter_count(mistral), 7241732096);  // Mistral 7B's count
}

// transformers 5 writes rope_theta and the scaling inside one rope_parameters object.
TEST(HfConfig, ReadsRopeParametersAsTransformers5WritesThem) {
  nlohmann::json file = llama_3_2_1b();
  file["rope_parameters"] = file["rope_scaling"];
  file["rope_parameters"]["rope_theta"] = 500000.0;
  file.erase("rope_scaling");
  file.erase("rope_theta");
  const ModelConfig config = parse_hf_config(file, "config.json");
  EXPECT_FLOAT_EQ(config.rope_theta, 500000.0f);
  EXPECT_TRUE(config.rope_scaling.llama3);
  EXPECT_FLOAT_EQ(config.rope_scaling.factor, 32.0f);
  file["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  const ModelConfig plain = parse_hf_config(file, "config.json");
  EXPECT_FLOAT_EQ(plain.rope_theta, 1e6f);
  EXPECT_FALSE(plain.rope_scaling.llama3);
}

TEST(HfConfig, WritesWhatItReadsBack) {
  for (const nlohmann::json& file : {llama_3_2_1b(), qwen2_5_0_5b(), mistral_7b()}) {
    const ModelConfig config = parse_hf_config(file, "config.json");
    const nlohmann::ordered_json written = hf_config_json(config);
    EXPECT_EQ(written["architectures"][0], file["architectures"][0]);
    const ModelConfig again = parse_hf_config(nlohmann::json::parse(written.dump()), "again");
    EXPECT_EQ(again.hf_model_type, config.hf_model_type);
    EXPECT_EQ(again.n_layer, config.n_layer);
    EXPECT_EQ(again.n_head, config.n_head);
    EXPECT_EQ(again.kv_heads(), config.kv_heads());
    EXPECT_EQ(again.head_dim(), config.head_dim());
    EXPECT_EQ(again.mlp_width(), config.mlp_width());
    EXPECT_EQ(again.n_positions, config.n_positions);
    EXPECT_EQ(again.vocab_size, config.vocab_size);
    EXPECT_EQ(again.padded_vocab_size, config.padded_vocab_size);
    EXPECT_EQ(again.layer_norm_epsilon, config.layer_norm_epsilon);
    EXPECT_EQ(again.rope_theta, config.rope_theta);
    EXPECT_EQ(again.rope_scaling.llama3, config.rope_scaling.llama3);
    EXPECT_EQ(again.rope_scaling.factor, config.rope_scaling.factor);
    EXPECT_EQ(again.rope_scaling.low_freq_factor, config.rope_scaling.low_freq_factor);
    EXPECT_EQ(again.rope_scaling.high_freq_factor, config.rope_scaling.high_freq_factor);
    EXPECT_EQ(again.tie_word_embeddings, config.tie_word_embeddings);
    EXPECT_EQ(again.attention_bias, config.attention_bias);
    EXPECT_EQ(again.attention_output_bias, config.attention_output_bias);
    EXPECT_EQ(again.sliding_window, config.sliding_window);
  }
}

// `--model llama-3.2-1b` and the model's own config.json describe the same model: every field
// hf_config_json writes agrees.
TEST(HfConfig, NamedLlamaConfigsAreThePublishedFiles) {
  const std::pair<const char*, nlohmann::json> published[] = {
      {"llama-3.2-1b", llama_3_2_1b()}, {"llama-3.2-3b", llama_3_2_3b()},
      {"llama-3-8b", llama_3_8b()},     {"qwen2.5-0.5b", qwen2_5_0_5b()},
      {"mistral-7b", mistral_7b()},     {"llama-2-13b", llama_2_13b()},
  };
  for (const auto& [name, file] : published) {
    const ModelConfig named = named_config(name);
    const ModelConfig read = parse_hf_config(file, std::string(name) + "/config.json");
    EXPECT_EQ(hf_config_json(named).dump(), hf_config_json(read).dump()) << name;
    EXPECT_EQ(named.padded_vocab_size, read.padded_vocab_size) << name;
    EXPECT_EQ(parameter_count(named), parameter_count(read)) << name;
  }
}

std::string error_of(const nlohmann::json& file) {
  try {
    parse_hf_config(file, "m/config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(HfConfig, RefusesWhatLayupCannotRunNamingTheField) {
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* expected;
  };
  const Case cases[] = {
      {"model_type", "phi3", "describes a \"phi3\" model; layup reads GPT-2"},
      {"hidden_act", "gelu", "hidden_act \"gelu\" is not supported"},
      {"mlp_bias", true, "\"mlp_bias\" is true, which layup does not support"},
      {"attention_dropout", 0.1, "attention_dropout is 0.1; layup trains without dropout"},
      {"pretraining_tp", 2, "pretraining_tp is 2"},
      {"use_sliding_window", true, "\"use_sliding_window\" is true"},
      {"layer_types", nlohmann::json::array({"full_attention", "sliding_attention"}),
       "layer_types holds \"sliding_attention\""},
      {"rope_scaling", nlohmann::json{{"rope_type", "yarn"}, {"factor", 4.0}},
       "rope_scaling of type \"yarn\" is not supported"},
      {"num_key_value_heads", 5,
       "\"num_key_value_heads\" is 5; it must be at least 1 and divide \"num_attention_heads\" 32"},
      {"num_key_value_heads", 0,
       "\"num_key_value_heads\" is 0; it must be at least 1 and divide \"num_attention_heads\" 32"},
      {"num_attention_heads", 0, "\"num_attention_heads\" is 0; it must be at least 1"},
      {"head_dim", 0, "\"head_dim\" is 0; it must be at least 1"},
      {"intermediate_size", 0, "\"intermediate_size\" is 0; it must be at least 1"},
      {"num_hidden_layers", 0, "\"num_hidden_layers\" is 0; it must be at least 1"},
      {"architectures", nlohmann::json::array({"BertForMaskedLM"}),
       "\"architectures\" names \"BertForMaskedLM\", a class layup does not train with "
       "model_type \"llama\"; layup trains GPT2LMHeadModel"},
      {"architectures", nlohmann::json::array({"Qwen2ForCausalLM"}),
       "\"architectures\" names \"Qwen2ForCausalLM\", a class layup does not train with "
       "model_type \"llama\""},
      {"architectures", "LlamaForCausalLM",
       "\"architectures\" is \"LlamaForCausalLM\", not a list"},
      {"hidden_size", "2048", "\"hidden_size\" is \"2048\", not an integer"},
      {"rms_norm_eps", "small", "\"rms_norm_eps\" is \"small\", not a number"},
  };
  for (const Case& c : cases) {
    nlohmann::json file = llama_3_2_1b();
    file[c.field] = c.value;
    const std::string message = error_of(file);
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.field << ": " << message;
    EXPECT_NE(message.find("m/config.json"), std::string::npos) << message;
  }
  nlohmann::json missing = llama_3_2_1b();
  missing.erase("intermediate_size");
  EXPECT_NE(error_of(missing).find("has no \"intermediate_size\"; a Llama, Qwen2 or Mistral"),
            std::string::npos)
      << error_of(missing);
}

// The head counts' consistency, each refused naming the file and the field.
TEST(HfConfig, RefusesHeadsThatDoNotShareTheWidth) {
  nlohmann::json file = llama_3_2_1b();
  file.erase("head_dim");
  file["num_attention_heads"] = 30;  // 2048 / 30 is no whole head
  file["num_key_value_heads"] = 6;
  EXPECT_NE(error_of(file).find("m/config.json: \"hidden_size\" 2048 is not divisible by "
                                "\"num_attention_heads\" 30; give \"head_dim\""),
            std::string::npos)
      << error_of(file);
  file["head_dim"] = 64;  // explicit: the heads need not add up to the width
  EXPECT_EQ(error_of(file), "");
  file["head_dim"] = 63;
  EXPECT_NE(error_of(file).find("m/config.json: the head width 63 must be even"), std::string::npos)
      << error_of(file);
}

// Absent or null num_key_value_heads is one per query head, as transformers reads it.
TEST(HfConfig, MissingKeyValueHeadsAreOnePerHead) {
  nlohmann::json file = llama_3_2_1b();
  file.erase("num_key_value_heads");
  EXPECT_EQ(parse_hf_config(file, "config.json").kv_heads(), 32);
  file["num_key_value_heads"] = nullptr;
  const ModelConfig config = parse_hf_config(file, "config.json");
  EXPECT_EQ(config.kv_heads(), 32);
  EXPECT_EQ(hf_config_json(config)["num_key_value_heads"], 32);
}

TEST(HfConfig, ArchitecturesMustBeTheClassLayupTrains) {
  // A GPT-2 shape under another class: its weights are not a GPT-2 language model's.
  const nlohmann::json gpt2 = nlohmann::json::parse(R"({
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 2,
    "n_embd": 16, "n_positions": 32, "vocab_size": 100})");
  EXPECT_EQ(error_of(gpt2), "");
  nlohmann::json bert = gpt2;
  bert["architectures"] = nlohmann::json::array({"BertForMaskedLM"});
  EXPECT_EQ(error_of(bert),
            "m/config.json: \"architectures\" names \"BertForMaskedLM\", a class layup does not "
            "train with model_type \"gpt2\"; layup trains GPT2LMHeadModel (\"gpt2\"), "
            "LlamaForCausalLM (\"llama\"), Qwen2ForCausalLM (\"qwen2\") and MistralForCausalLM "
            "(\"mistral\"): give the config.json of one of those");
  bert["model_type"] = "bert";
  EXPECT_NE(error_of(bert).find("describes a \"bert\" model"), std::string::npos);
  // The field is optional: absent, null or empty, model_type decides alone.
  for (const nlohmann::json& none : {nlohmann::json(), nlohmann::json::array()}) {
    nlohmann::json file = gpt2;
    file["architectures"] = none;
    EXPECT_EQ(error_of(file), "") << none.dump();
  }
  nlohmann::json absent = qwen2_5_0_5b();
  absent.erase("architectures");
  EXPECT_EQ(error_of(absent), "");
}

// Qwen2's file leaves head_dim to transformers' hidden_size / num_attention_heads, so a Qwen2 whose
// heads are not that share is written with it, or it would read back as another model.
TEST(HfConfig, Qwen2WithItsOwnHeadWidthWritesItBack) {
  nlohmann::json file = qwen2_5_0_5b();
  EXPECT_FALSE(hf_config_json(parse_hf_config(file, "config.json")).contains("head_dim"));
  file["head_dim"] = 128;
  const ModelConfig config = parse_hf_config(file, "config.json");
  const nlohmann::ordered_json written = hf_config_json(config);
  EXPECT_EQ(written["head_dim"], 128);
  EXPECT_EQ(parse_hf_config(nlohmann::json::parse(written.dump()), "again").head_dim(), 128);
}

}  // namespace
}  // namespace layup
