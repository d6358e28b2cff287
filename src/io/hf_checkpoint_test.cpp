// Tests of the Hugging Face GPT-2 checkpoint: exact round trip, the layout HF expects (names,
// transposed Conv1D weights, unpadded vocabulary, config.json), and an error for every kind of
// checkpoint this engine cannot run.
#include "io/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/rng.h"
#include "io/safetensors.h"
#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

ModelConfig tiny_config() {
  return gpt2_config(2, 2, 8, 16, 50);
}

// Random parameters with the padded embedding rows zero, as a trained model has them.
std::vector<float> random_params(const ParameterLayout& layout, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> params(layout.total_count());
  for (float& value : params) value = rng.normal();
  const ModelConfig& config = layout.config();
  std::fill(params.begin() + layout.embeddings().wte + config.vocab_size * config.n_embd,
            params.begin() + layout.embeddings().wte + config.padded_vocab_size * config.n_embd,
            0.0f);
  return params;
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct ExtraTensor {
  std::string name;
  std::vector<size_t> shape;
  std::vector<float> values;
};

// Rewrites a saved model's weights file: every tensor renamed by `rename` except `drop`, plus
// `extra`.
void rewrite_weights(const std::string& dir, const std::function<std::string(std::string)>& rename,
                     const std::vector<ExtraTensor>& extra = {}, const std::string& drop = "") {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  {
    SafetensorsReader reader(path);
    for (const SafetensorsTensorInfo& info : reader.tensors()) {
      if (info.name == drop) continue;
      values.push_back(reader.read_floats(info.name));
      tensors.push_back({rename(info.name), info.shape, nullptr, {}});
    }
  }
  for (const ExtraTensor& tensor : extra) {
    values.push_back(tensor.values);
    tensors.push_back({tensor.name, tensor.shape, nullptr, {}});
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = values[i].data();
  write_safetensors(path, tensors, {{"format", "pt"}});
}

// Sets element `index` of tensor `name` in a saved model's weights file to `value`.
void poison_weight(const std::string& dir, const std::string& name, size_t index, float value) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> tensors;
  {
    SafetensorsReader reader(path);
    for (const SafetensorsTensorInfo& info : reader.tensors()) {
      values.push_back(reader.read_floats(info.name));
      if (info.name == name) values.back().at(index) = value;
      tensors.push_back({info.name, info.shape, nullptr, {}});
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = values[i].data();
  write_safetensors(path, tensors, {{"format", "pt"}});
}

std::string same_name(std::string name) {
  return name;
}

class HfCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = tiny_config();
    layout_ = std::make_unique<ParameterLayout>(config_);
    params_ = random_params(*layout_, 7);
    model_dir_ = dir_.file("model");
    save_hf_model(model_dir_, config_, *layout_, params_.data());
  }

  // Loads the model, expects a layup::Error, and checks that loading changed no file.
  std::string load_error() {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] { load_hf_model(model_dir_); });
    EXPECT_EQ(snapshot(dir_.path()), before);
    return message;
  }

  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    const std::string path = model_dir_ + "/config.json";
    nlohmann::json json = nlohmann::json::parse(read_text(path));
    edit(json);
    write_text(path, json.dump(2));
  }

  TempDir dir_;
  ModelConfig config_;
  std::unique_ptr<ParameterLayout> layout_;
  std::vector<float> params_;
  std::string model_dir_;
};

TEST_F(HfCheckpoint, SaveLoadIsBitIdenticalIncludingZeroPaddedRows) {
  // model.safetensors, config.json, generation_config.json, no temporaries
  EXPECT_EQ(snapshot(model_dir_).size(), 3u);
  const LoadedModel loaded = load_hf_model(model_dir_);
  EXPECT_EQ(loaded.config.n_layer, 2);
  EXPECT_EQ(loaded.config.n_head, 2);
  EXPECT_EQ(loaded.config.n_embd, 8);
  EXPECT_EQ(loaded.config.n_positions, 16);
  EXPECT_EQ(loaded.config.vocab_size, 50);
  EXPECT_EQ(loaded.config.padded_vocab_size, 128);
  EXPECT_EQ(loaded.config.layer_norm_epsilon, 1e-5f);
  EXPECT_TRUE(bit_identical(loaded.params, params_));
}

TEST_F(HfCheckpoint, WritesWhatTransformersExpects) {
  SafetensorsReader reader(model_dir_ + "/model.safetensors");
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_EQ(reader.tensors().size(), 2u + 12u * 2 + 2);
  EXPECT_EQ(reader.find("lm_head.weight"), nullptr);  // tied
  for (const SafetensorsTensorInfo& tensor : reader.tensors()) {
    EXPECT_TRUE(tensor.name.starts_with("transformer.")) << tensor.name;
  }
  EXPECT_EQ(reader.find("transformer.wte.weight")->shape, (std::vector<size_t>{50, 8}));
  EXPECT_EQ(reader.find("transformer.wpe.weight")->shape, (std::vector<size_t>{16, 8}));
  EXPECT_EQ(reader.find("transformer.h.1.attn.c_attn.weight")->shape, (std::vector<size_t>{8, 24}));
  EXPECT_EQ(reader.find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<size_t>{32, 8}));
  EXPECT_EQ(reader.find("transformer.ln_f.bias")->shape, (std::vector<size_t>{8}));

  // Conv1D weights are [in, out]: HF's [i][o] is layup's [o][i].
  const std::vector<float> qkv = reader.read_floats("transformer.h.1.attn.c_attn.weight");
  const float* layup_qkv =
      params_.data() + layout_->block_offset(1) + layout_->block().attn_qkv_weight;
  for (size_t i = 0; i < 8; ++i) {
    for (size_t o = 0; o < 24; ++o) ASSERT_EQ(qkv[i * 24 + o], layup_qkv[o * 8 + i]);
  }

  const nlohmann::json json = nlohmann::json::parse(read_text(model_dir_ + "/config.json"));
  EXPECT_EQ(json["model_type"], "gpt2");
  EXPECT_EQ(json["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(json["activation_function"], "gelu_new");
  EXPECT_EQ(json["n_embd"], 8);
  EXPECT_EQ(json["n_head"], 2);
  EXPECT_EQ(json["n_layer"], 2);
  EXPECT_EQ(json["n_positions"], 16);
  EXPECT_EQ(json["n_ctx"], 16);
  EXPECT_EQ(json["vocab_size"], 50);
  EXPECT_TRUE(json["n_inner"].is_null());
  EXPECT_EQ(json["tie_word_embeddings"], true);
  EXPECT_EQ(json["eos_token_id"], 49);  // 50256 does not exist in a 50-token vocabulary
  EXPECT_EQ(json["layup"]["padded_vocab_size"], 128);
  EXPECT_TRUE(contains(read_text(model_dir_ + "/config.json"), "\"layer_norm_epsilon\": 1e-05"));
}

TEST_F(HfCheckpoint, LoadsNamesWithoutPrefixAndIgnoresMaskBuffersAndTiedHead) {
  const std::vector<float> wte(params_.begin(), params_.begin() + 50 * 8);
  rewrite_weights(model_dir_,
                  [](std::string name) { return name.substr(std::strlen("transformer.")); },
                  {{"h.0.attn.bias", {1, 1, 4, 4}, std::vector<float>(16, 1.0f)},
                   {"h.1.attn.masked_bias", {}, {-1e4f}},
                   {"lm_head.weight", {50, 8}, wte}});
  EXPECT_TRUE(bit_identical(load_hf_model(model_dir_).params, params_));
}

TEST_F(HfCheckpoint, UntiedHeadIsAnError) {
  std::vector<float> head(params_.begin(), params_.begin() + 50 * 8);
  head[3 * 8 + 5] += 1.0f;
  rewrite_weights(model_dir_, same_name, {{"lm_head.weight", {50, 8}, head}});
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, "lm_head.weight differs from the token embedding"));
  EXPECT_TRUE(contains(message, "row 3, column 5"));
  EXPECT_TRUE(contains(message, "ties them (tie_word_embeddings)"));
}

TEST_F(HfCheckpoint, MissingTensorIsNamed) {
  rewrite_weights(model_dir_, same_name, {}, "transformer.h.1.mlp.c_proj.bias");
  const std::string message = load_error();
  EXPECT_TRUE(
      contains(message, "model.safetensors has no tensor 'transformer.h.1.mlp.c_proj.bias'"));
  EXPECT_TRUE(contains(message, "1 of 28 tensors"));
}

TEST_F(HfCheckpoint, WrongShapeIsNamed) {
  edit_config([](nlohmann::json& json) { json["n_positions"] = 32; });
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, "tensor 'transformer.wpe.weight' has shape [16, 8]"));
  EXPECT_TRUE(contains(message, "needs [32, 8]"));
}

TEST_F(HfCheckpoint, TensorOfAnotherModelIsAnError) {
  edit_config([](nlohmann::json& json) { json["n_layer"] = 1; });
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, "'transformer.h.1."));
  EXPECT_TRUE(contains(message, "layers=1"));
  EXPECT_TRUE(contains(message, "describe different models"));
}

// What a resume checks before it plans: the same refusal from the files' headers alone.
TEST_F(HfCheckpoint, WeightsOfAnotherShapeAreRefusedBeforeAnyIsRead) {
  EXPECT_NO_THROW(check_hf_weights(model_dir_, config_));
  edit_config([](nlohmann::json& json) { json["n_positions"] = 32; });
  const std::string message =
      error_message([&] { check_hf_weights(model_dir_, read_hf_model_config(model_dir_)); });
  EXPECT_TRUE(contains(message, "tensor 'transformer.wpe.weight' has shape [16, 8]")) << message;
  EXPECT_TRUE(contains(message, "describe different models")) << message;
}

TEST_F(HfCheckpoint, DamagedWeightsFile) {
  const std::string path = model_dir_ + "/model.safetensors";
  const std::string bytes = read_text(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  write_text(path, bytes.substr(0, 8 + header_length + 100));  // truncated inside the data
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, path));
  EXPECT_TRUE(contains(message, "beyond the end of the data section"));
}

TEST_F(HfCheckpoint, NonFiniteWeightIsNamedWithItsIndex) {
  // A transposed matrix is checked as stored: the index is the one a safetensors reader sees.
  poison_weight(model_dir_, "transformer.h.0.attn.c_attn.weight", 17,
                std::numeric_limits<float>::infinity());
  std::string message = load_error();
  EXPECT_TRUE(contains(message, model_dir_ + "/model.safetensors: tensor "
                                             "'transformer.h.0.attn.c_attn.weight' holds inf at "
                                             "element 17 (row 0, column 17)"));
  EXPECT_TRUE(contains(message, "load an earlier checkpoint"));

  save_hf_model(model_dir_, config_, *layout_, params_.data());
  poison_weight(model_dir_, "transformer.h.1.ln_2.bias", 3,
                std::numeric_limits<float>::quiet_NaN());
  message = load_error();
  EXPECT_TRUE(contains(message, "tensor 'transformer.h.1.ln_2.bias' holds nan at element 3;"));
}

TEST_F(HfCheckpoint, RandomBytesAsWeightsAreRefused) {
  // F32 from random bytes is NaN or infinite once in 256 values; a model has thousands.
  const std::string path = model_dir_ + "/model.safetensors";
  std::string bytes = read_text(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  Rng rng(3);
  for (size_t i = 8 + header_length; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(rng.below(256));
  }
  write_text(path, bytes);
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, path + ": tensor '"));
  EXPECT_TRUE(contains(message, "weights are never NaN or infinite"));
}

TEST_F(HfCheckpoint, ConfigErrors) {
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string expected;
  };
  const Case cases[] = {
      {[](nlohmann::json& j) { j["model_type"] = "gpt_neox"; }, "describes a \"gpt_neox\" model"},
      {[](nlohmann::json& j) { j.erase("model_type"); }, "has no \"model_type\""},
      {[](nlohmann::json& j) { j["activation_function"] = "relu"; },
       "activation_function \"relu\" is not supported"},
      {[](nlohmann::json& j) { j["n_inner"] = 10; }, "n_inner is 10"},
      {[](nlohmann::json& j) { j.erase("n_embd"); }, "has no \"n_embd\""},
      {[](nlohmann::json& j) { j["n_head"] = "two"; }, "\"n_head\" is \"two\", not an integer"},
      {[](nlohmann::json& j) { j["n_head"] = 3; }, "\"n_embd\" 8 is not divisible by \"n_head\" 3"},
      {[](nlohmann::json& j) { j["n_head"] = 0; }, "\"n_head\" is 0; it must be at least 1"},
      {[](nlohmann::json& j) { j["architectures"] = nlohmann::json::array({"BertForMaskedLM"}); },
       "\"architectures\" names \"BertForMaskedLM\", a class layup does not train"},
      {[](nlohmann::json& j) { j["tie_word_embeddings"] = false; },
       "\"tie_word_embeddings\" is false"},
      {[](nlohmann::json& j) { j["scale_attn_by_inverse_layer_idx"] = true; },
       "\"scale_attn_by_inverse_layer_idx\" is true"},
      {[](nlohmann::json& j) { j["vocab_size"] = 70000; }, "out of range 1..65536"},
      {[](nlohmann::json& j) { j = nlohmann::json::array(); }, "instead of a JSON object"},
  };
  const std::string config_path = model_dir_ + "/config.json";
  const std::string original = read_text(config_path);
  for (const Case& c : cases) {
    write_text(config_path, original);
    edit_config(c.edit);
    const std::string message = load_error();
    EXPECT_TRUE(contains(message, config_path));
    EXPECT_TRUE(contains(message, c.expected));
  }
  write_text(config_path, original);
  edit_config([](nlohmann::json& j) { j["activation_function"] = "gelu_pytorch_tanh"; });
  EXPECT_NO_THROW(load_hf_model(model_dir_));
}

TEST_F(HfCheckpoint, ConfigIsNotJson) {
  write_text(model_dir_ + "/config.json", "{\"n_layer\": 2,");
  EXPECT_TRUE(contains(load_error(), "config.json is not valid JSON"));
}

TEST_F(HfCheckpoint, MissingFilesAndDirectory) {
  std::filesystem::remove(model_dir_ + "/config.json");
  EXPECT_TRUE(contains(load_error(), "cannot open " + model_dir_ + "/config.json"));
  const std::string message = error_message([&] { load_hf_model(dir_.file("nowhere")); });
  EXPECT_TRUE(contains(message, "is not a directory"));
}

TEST_F(HfCheckpoint, HonoursAnotherPaddingRecordedByLayup) {
  edit_config([](nlohmann::json& j) { j["layup"]["padded_vocab_size"] = 64; });
  const LoadedModel loaded = load_hf_model(model_dir_);
  EXPECT_EQ(loaded.config.padded_vocab_size, 64);
  EXPECT_EQ(loaded.params.size(), ParameterLayout(loaded.config).total_count());
  // Without the layup key (a checkpoint from the hub) the vocabulary is padded to 128.
  edit_config([](nlohmann::json& j) { j.erase("layup"); });
  EXPECT_EQ(load_hf_model(model_dir_).config.padded_vocab_size, 128);
}

// The sharded layout, and streaming in both directions.
class HfCheckpointSharded : public HfCheckpoint {
 protected:
  static constexpr size_t kMaxShardBytes = 1024;  // wte (1600 bytes) gets a shard of its own
  static constexpr size_t kChunkBytes = 64;       // 16 floats: less than a row of c_attn's 24

  void SetUp() override {
    HfCheckpoint::SetUp();
    sharded_dir_ = dir_.file("sharded");
    save_sharded(sharded_dir_);
  }

  // Saves params_ sharded, reading them in chunks; returns the largest request.
  size_t save_sharded(const std::string& dir, size_t max_shard_bytes = kMaxShardBytes) {
    size_t largest = 0;
    save_hf_model_sharded(
        dir, config_, *layout_,
        [&](size_t offset, size_t count, float* out) {
          largest = std::max(largest, count);
          std::memcpy(out, params_.data() + offset, count * sizeof(float));
        },
        max_shard_bytes, kChunkBytes);
    return largest;
  }

  std::vector<std::string> file_names(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& [name, contents] : snapshot(dir)) names.push_back(name);
    return names;
  }

  std::string sharded_dir_;
};

TEST_F(HfCheckpointSharded, RoundTripIsBitIdenticalAndStreamsInChunks) {
  EXPECT_EQ(save_sharded(sharded_dir_), kChunkBytes / sizeof(float));
  const std::vector<std::string> names = file_names(sharded_dir_);
  // config.json, generation_config.json, the index and several shards, no temporaries
  ASSERT_GT(names.size(), 5u);
  EXPECT_EQ(names[0], "config.json");
  EXPECT_EQ(names[1], "generation_config.json");
  EXPECT_EQ(names[2], "model-00001-of-" + names[2].substr(15, 5) + ".safetensors");
  EXPECT_EQ(names.back(), "model.safetensors.index.json");
  EXPECT_TRUE(has_hf_weights(sharded_dir_));

  const nlohmann::json index =
      nlohmann::json::parse(read_text(sharded_dir_ + "/model.safetensors.index.json"));
  const size_t padded_rows = (config_.padded_vocab_size - config_.vocab_size) * config_.n_embd;
  EXPECT_EQ(index["metadata"]["total_size"], (layout_->total_count() - padded_rows) * 4);
  EXPECT_EQ(index["weight_map"].size(), layout_->tensors().size());
  EXPECT_EQ(index["weight_map"]["transformer.wte.weight"], names[2]);

  EXPECT_TRUE(bit_identical(load_hf_model(sharded_dir_).params, params_));

  // The streamed load writes every element once, in order, a chunk at most at a time.
  const ModelConfig config = read_hf_model_config(sharded_dir_);
  std::vector<float> loaded(layout_->total_count(), -1.0f);
  size_t next_offset = 0;
  load_hf_model_streamed(
      sharded_dir_, config,
      [&](size_t offset, size_t count, const float* in) {
        ASSERT_EQ(offset, next_offset);
        ASSERT_LE(count, kChunkBytes / sizeof(float));
        std::memcpy(loaded.data() + offset, in, count * sizeof(float));
        next_offset += count;
      },
      kChunkBytes);
  EXPECT_EQ(next_offset, layout_->total_count());
  EXPECT_TRUE(bit_identical(loaded, params_));
}

TEST_F(HfCheckpointSharded, ShardsHoldWhatTheSingleFileHolds) {
  const SafetensorsFileSet single =
      SafetensorsFileSet::open_single(model_dir_ + "/model.safetensors");
  const SafetensorsFileSet sharded =
      SafetensorsFileSet::open_index(sharded_dir_ + "/model.safetensors.index.json");
  EXPECT_GT(sharded.files().size(), 1u);
  for (const SafetensorsFileSet::Located& shard : sharded.tensors()) {
    EXPECT_EQ(shard.file->metadata().at("format"), "pt");
    const SafetensorsFileSet::Located whole = single.find(shard.tensor->name);
    ASSERT_NE(whole.tensor, nullptr) << shard.tensor->name;
    EXPECT_EQ(whole.tensor->shape, shard.tensor->shape);
    std::vector<float> a(whole.tensor->element_count), b(shard.tensor->element_count);
    whole.file->read_floats(*whole.tensor, 0, a);
    shard.file->read_floats(*shard.tensor, 0, b);
    EXPECT_TRUE(bit_identical(a, b)) << shard.tensor->name;
  }
  EXPECT_EQ(sharded.tensors().size(), single.tensors().size());
}

TEST_F(HfCheckpointSharded, EachSaveRemovesTheWeightFilesOfTheLayoutItReplaces) {
  // Single file -> sharded: model.safetensors goes.
  save_sharded(model_dir_);
  const std::vector<std::string> sharded = file_names(model_dir_);
  EXPECT_EQ(sharded, file_names(sharded_dir_));
  // Fewer, larger shards: the shards of the earlier plan go.
  save_sharded(model_dir_, 4096);
  const std::vector<std::string> fewer = file_names(model_dir_);
  EXPECT_LT(fewer.size(), sharded.size());
  for (const std::string& name : fewer) {
    EXPECT_TRUE(name == "config.json" || name == "generation_config.json" ||
                name == "model.safetensors.index.json" ||
                name.ends_with("-of-0000" + std::to_string(fewer.size() - 3) + ".safetensors"))
        << name;
  }
  EXPECT_TRUE(bit_identical(load_hf_model(model_dir_).params, params_));
  // A limit the whole model fits under gives model.safetensors alone, as save_pretrained does.
  save_sharded(model_dir_, 1 << 20);
  EXPECT_EQ(
      file_names(model_dir_),
      (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
  save_sharded(model_dir_);
  save_hf_model(model_dir_, config_, *layout_, params_.data());
  EXPECT_EQ(
      file_names(model_dir_),
      (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
}

TEST_F(HfCheckpointSharded, BothLayoutsAtOnceAreAmbiguous) {
  std::filesystem::copy_file(model_dir_ + "/model.safetensors",
                             sharded_dir_ + "/model.safetensors");
  model_dir_ = sharded_dir_;
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, sharded_dir_ + " holds both model.safetensors and "
                                               "model.safetensors.index.json"));
  EXPECT_TRUE(contains(message, "remove the older one"));
}

TEST_F(HfCheckpointSharded, NoWeightsAtAll) {
  std::filesystem::remove(model_dir_ + "/model.safetensors");
  EXPECT_FALSE(has_hf_weights(model_dir_));
  EXPECT_TRUE(contains(load_error(), model_dir_ + " holds neither model.safetensors nor "
                                                  "model.safetensors.index.json"));
}

TEST_F(HfCheckpointSharded, MissingShardIsNamed) {
  const std::string shard = sharded_dir_ + "/" + file_names(sharded_dir_)[2];
  std::filesystem::remove(shard);
  model_dir_ = sharded_dir_;
  const std::string message = load_error();
  EXPECT_TRUE(contains(message, sharded_dir_ + "/model.safetensors.index.json maps "));
  EXPECT_TRUE(contains(message, shard + " does not exist"));
}

TEST_F(HfCheckpointSharded, NonFiniteWeightInAShardNamesTheShard) {
  const SafetensorsFileSet set =
      SafetensorsFileSet::open_index(sharded_dir_ + "/model.safetensors.index.json");
  const SafetensorsFileSet::Located bias = set.find("transformer.h.1.ln_2.bias");
  const std::string shard = bias.file->path();
  const size_t position = bias.tensor->data_begin + 3 * sizeof(float);
  std::string bytes = read_text(shard);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 8 + header_length + position, &nan, 4);
  write_text(shard, bytes);
  model_dir_ = sharded_dir_;
  EXPECT_TRUE(contains(load_error(),
                       shard + ": tensor 'transformer.h.1.ln_2.bias' holds nan at element 3;"));
}

TEST_F(HfCheckpointSharded, FailedSaveLeavesThePreviousCheckpointAsItWas) {
  for (const std::string& dir : {sharded_dir_, model_dir_}) {
    const auto before = snapshot(dir_.path());
    size_t calls = 0;
    const std::string message = error_message([&] {
      save_hf_model_sharded(
          dir, config_, *layout_,
          [&](size_t offset, size_t count, float* out) {
            // Far enough in that some shards are complete before the failure.
            if (++calls == 60) fail("cannot copy parameters from the GPU");
            std::memcpy(out, params_.data() + offset, count * sizeof(float));
          },
          kMaxShardBytes, kChunkBytes);
    });
    EXPECT_EQ(message, "cannot copy parameters from the GPU");
    EXPECT_EQ(snapshot(dir_.path()), before);
  }
}

TEST_F(HfCheckpointSharded, StreamedLoadChecksEveryShapeBeforeTheFirstWrite) {
  edit_config([](nlohmann::json& json) { json["n_positions"] = 32; });
  const ModelConfig config = read_hf_model_config(model_dir_);
  size_t writes = 0;
  const std::string message = error_message([&] {
    load_hf_model_streamed(model_dir_, config, [&](size_t, size_t, const float*) { ++writes; });
  });
  EXPECT_TRUE(contains(message, "tensor 'transformer.wpe.weight' has shape [16, 8]"));
  EXPECT_EQ(writes, 0u);
}

TEST_F(HfCheckpointSharded, UntiedHeadIsFoundPastTheFirstChunk) {
  std::vector<float> head(params_.begin(), params_.begin() + 50 * 8);
  head[30 * 8 + 5] += 1.0f;
  rewrite_weights(model_dir_, same_name, {{"lm_head.weight", {50, 8}, head}});
  const std::string message = error_message([&] {
    load_hf_model_streamed(
        model_dir_, config_, [](size_t, size_t, const float*) {}, kChunkBytes);
  });
  EXPECT_TRUE(contains(message,
                       "lm_head.weight differs from the token embedding (first at "
                       "row 30, column 5)"));
}

}  // namespace
}  // namespace layup
