// Tests of what a saved model folder carries to be handed on: weights in bf16 rounded to nearest
// even, config.json's special token ids and torch_dtype, the tokenizer's files and
// generation_config.json, inside a checkpoint's atomic write.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/test_files.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::TempDir;
using test_files::write_text;

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_text(path));
}

// The bfloat16 of `value` computed as a sum over the bits, not with the rounding trick.
uint16_t reference_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t kept = bits >> 16, dropped = bits & 0xffff;
  const bool up = dropped > 0x8000 || (dropped == 0x8000 && (kept & 1));
  return static_cast<uint16_t>(kept + (up ? 1 : 0));
}

TEST(WeightsBf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3F80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: the tie goes to the even 1.
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between two odd-even neighbours: up to the even 1 + 2^-6.
  EXPECT_EQ(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bfloat16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7F80);  // past bf16's largest
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
  // A NaN whose payload is in the low half only stays a NaN.
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::bit_cast<float>(0x7F800001u)))));
  Rng rng(3);
  for (int i = 0; i < 100000; ++i) {
    const float value = rng.normal() * std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
    ASSERT_EQ(float_to_bfloat16(value), reference_bfloat16(value)) << value;
  }
}

TEST(WeightsBf16, WritersStoreBf16AndReadItBack) {
  TempDir dir;
  const std::vector<SafetensorsTensorShape> tensors = {{"a", {3}, SafetensorsDtype::kBF16},
                                                       {"b", {2}, SafetensorsDtype::kF32}};
  const std::vector<float> a = {1.0f + std::ldexp(1.0f, -8), -2.5f, 0.1f}, b = {0.1f, 7.0f};
  const TensorRangeSource source = [&](size_t index, size_t first, std::span<float> out) {
    const std::vector<float>& values = index == 0 ? a : b;
    std::copy_n(values.begin() + first, out.size(), out.begin());
  };
  write_streamed_safetensors(dir.file("t.safetensors"), tensors, source, {}, 2 * sizeof(float));
  const SafetensorsReader reader(dir.file("t.safetensors"));
  EXPECT_EQ(reader.find("a")->dtype, "BF16");
  EXPECT_EQ(reader.find("a")->data_end - reader.find("a")->data_begin, 6u);
  EXPECT_EQ(reader.find("b")->dtype, "F32");
  EXPECT_EQ(reader.read_floats("a"),
            (std::vector<float>{1.0f, -2.5f, bfloat16_to_float(float_to_bfloat16(0.1f))}));
  EXPECT_EQ(reader.read_floats("b"), b);
  // Shards are planned on the stored bytes: 6 + 8 bytes fit 14, not 20.
  EXPECT_EQ(plan_shards(tensors, 14, "w").size(), 1u);
  EXPECT_EQ(plan_shards(tensors, 13, "w").size(), 2u);
}

TEST(HfConfigExtras, SpecialTokenIdsAreKeptAsGiven) {
  const nlohmann::json source = {{"bos_token_id", 128000},
                                 {"eos_token_id", {128001, 128008, 128009}},
                                 {"pad_token_id", nullptr}};
  HfConfigExtras extras = parse_hf_config_extras(source, "config.json");
  extras.torch_dtype = "bfloat16";
  const ModelConfig llama = llama_config(2, 4, 2, 32, 64, 64, 300);
  const nlohmann::ordered_json written = hf_config_json(llama, extras);
  EXPECT_EQ(written["bos_token_id"], 128000);
  EXPECT_EQ(written["eos_token_id"], nlohmann::json({128001, 128008, 128009}));
  EXPECT_FALSE(written.contains("pad_token_id"));
  EXPECT_EQ(written["torch_dtype"], "bfloat16");
  // What was written reads back the same, and the model's shape is untouched by the extras.
  const HfConfigExtras again = parse_hf_config_extras(written, "config.json");
  EXPECT_EQ(again.bos_token_id, extras.bos_token_id);
  EXPECT_EQ(again.eos_token_id, extras.eos_token_id);
  EXPECT_FALSE(first_shape_difference(parse_hf_config(written, "config.json"), llama));
  // Without extras the Llama file names no special tokens; GPT-2's names <|endoftext|>, or the
  // source's ids where it has them.
  EXPECT_FALSE(hf_config_json(llama).contains("bos_token_id"));
  const ModelConfig gpt2 = gpt2_config(2, 2, 8, 16);
  EXPECT_EQ(hf_config_json(gpt2)["eos_token_id"], 50256);
  HfConfigExtras padded;
  padded.pad_token_id = 7;
  padded.eos_token_id = 3;
  EXPECT_EQ(hf_config_json(gpt2, padded)["pad_token_id"], 7);
  EXPECT_EQ(hf_config_json(gpt2, padded)["eos_token_id"], 3);
  EXPECT_EQ(hf_config_json(gpt2, padded)["bos_token_id"], 50256);
}

TEST(HfConfigExtras, RefusesIdsThatAreNotIds) {
  for (const nlohmann::json& bad :
       {nlohmann::json("2"), nlohmann::json(-1), nlohmann::json({1, "x"}), nlohmann::json(1.5)}) {
    const std::string message = error_message([&] {
      parse_hf_config_extras({{"eos_token_id", bad}}, "my/config.json");
    });
    EXPECT_TRUE(contains(message, "my/config.json: \"eos_token_id\" is " + bad.dump())) << message;
  }
}

class HfFolderExtrasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = dir_.file("source");
    fs::create_directories(source_);
    write_text(source_ + "/tokenizer.json", "{\"model\": \"tokenizer bytes\"}\n");
    write_text(source_ + "/tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    write_text(source_ + "/special_tokens_map.json", "{}");
    write_text(source_ + "/unrelated.txt", "not copied");
    Rng rng(5);
    params_.resize(layout_.total_count());
    for (float& value : params_) value = rng.normal();
    // The padded vocabulary rows are zero, as in a trained model (a save drops them).
    for (const TensorSpec& tensor : layout_.tensors())
      if (tensor.init == TensorInit::kVocabularyNormal)
        std::fill(params_.begin() + tensor.offset + config_.vocab_size * config_.n_embd,
                  params_.begin() + tensor.offset + tensor.count, 0.0f);
    extras_.config.bos_token_id = 1;
    extras_.config.eos_token_id = 2;
  }

  TempDir dir_;
  std::string source_;
  const ModelConfig config_ = llama_config(2, 4, 2, 32, 64, 64, 300);
  const ParameterLayout layout_{config_};
  std::vector<float> params_;
  HfFolderExtras extras_;
};

TEST_F(HfFolderExtrasTest, TokenizerFilesAreReadAsTheyAre) {
  std::vector<HfCompanionFile> files = read_hf_companion_files(source_, source_);
  ASSERT_EQ(files.size(), 3u);  // no generation_config.json in the source
  EXPECT_EQ(files[0].name, "tokenizer.json");
  EXPECT_EQ(files[0].bytes, "{\"model\": \"tokenizer bytes\"}\n");
  EXPECT_EQ(files[1].name, "tokenizer_config.json");
  EXPECT_EQ(files[2].name, "special_tokens_map.json");
  write_text(source_ + "/generation_config.json", "{\"temperature\": 0.6}");
  files = read_hf_companion_files(source_ + "/tokenizer.json", source_);
  ASSERT_EQ(files.size(), 4u);  // the file given, its folder's other tokenizer files
  EXPECT_EQ(files[3].name, "generation_config.json");
  // A tokenizer file by another name travels alone, as tokenizer.json.
  write_text(dir_.file("mine.json"), "{}");
  files = read_hf_companion_files(dir_.file("mine.json"), "");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].name, "tokenizer.json");
  EXPECT_TRUE(read_hf_companion_files("", "").empty());
}

TEST_F(HfFolderExtrasTest, Bf16FolderCarriesItsTokenizerAndIds) {
  extras_.dtype = WeightsDtype::kBf16;
  extras_.files = read_hf_companion_files(source_, source_);
  const std::string saved = dir_.file("saved");
  save_hf_model(saved, config_, layout_, params_.data(), extras_);

  EXPECT_EQ(read_text(saved + "/tokenizer.json"), read_text(source_ + "/tokenizer.json"));
  EXPECT_EQ(read_text(saved + "/tokenizer_config.json"),
            read_text(source_ + "/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(saved + "/unrelated.txt"));
  const nlohmann::json config = read_json(saved + "/config.json");
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_EQ(
      read_json(saved + "/generation_config.json"),
      nlohmann::json({{"_from_model_config", true}, {"bos_token_id", 1}, {"eos_token_id", 2}}));

  // Every weight is stored as bf16, half the bytes, and loads as the bf16 nearest the fp32 one.
  EXPECT_EQ(hf_weights_dtype(saved), WeightsDtype::kBf16);
  const SafetensorsReader reader(saved + "/model.safetensors");
  for (const SafetensorsTensorInfo& tensor : reader.tensors()) {
    EXPECT_EQ(tensor.dtype, "BF16") << tensor.name;
    EXPECT_EQ(tensor.data_end - tensor.data_begin, 2 * tensor.element_count) << tensor.name;
  }
  const LoadedModel loaded = load_hf_model(saved);
  ASSERT_EQ(loaded.params.size(), params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    ASSERT_EQ(loaded.params[i], bfloat16_to_float(float_to_bfloat16(params_[i]))) << i;
}

TEST_F(HfFolderExtrasTest, Fp32FolderIsExactAndKeepsTheSourcesGenerationConfig) {
  write_text(source_ + "/generation_config.json", "{\"do_sample\": true, \"eos_token_id\": 2}");
  extras_.files = read_hf_companion_files(source_, source_);
  const std::string saved = dir_.file("saved");
  save_hf_model(saved, config_, layout_, params_.data(), extras_);
  EXPECT_EQ(read_text(saved + "/generation_config.json"),
            "{\"do_sample\": true, \"eos_token_id\": 2}");
  EXPECT_EQ(read_json(saved + "/config.json")["torch_dtype"], "float32");
  EXPECT_EQ(hf_weights_dtype(saved), WeightsDtype::kFp32);
  EXPECT_EQ(load_hf_model(saved).params, params_);
  // A folder saved with its extras is a source like any other: the same files come out of it.
  const std::vector<HfCompanionFile> again = read_hf_companion_files(saved, saved);
  EXPECT_EQ(again.size(), extras_.files.size());
  EXPECT_EQ(read_hf_config_extras(saved + "/config.json").eos_token_id, 2);
}

TEST_F(HfFolderExtrasTest, CheckpointHasItsExtrasOrIsAbsent) {
  extras_.files = read_hf_companion_files(source_, source_);
  CheckpointWriteOptions options;
  options.hf = extras_;
  options.hf.dtype = WeightsDtype::kBf16;
  StreamedCheckpoint checkpoint;
  checkpoint.progress.step = 4;
  checkpoint.read_params = [&](size_t offset, size_t count, float* out) {
    std::copy_n(params_.begin() + offset, count, out);
  };
  size_t moment_reads = 0;
  checkpoint.read_moments = [&](AdamMoment, size_t offset, size_t count, float* out) {
    // The state stays fp32: values no bf16 holds come back exactly.
    for (size_t i = 0; i < count; ++i) out[i] = 1.0f + std::ldexp(1.0f, -20) * (offset + i);
    ++moment_reads;
  };
  const std::string run = dir_.file("run");
  const SavedCheckpoint saved =
      save_checkpoint_streamed(run, config_, layout_, checkpoint, options);
  EXPECT_EQ(read_text(saved.path + "/tokenizer.json"), read_text(source_ + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(saved.path + "/generation_config.json"));
  // The bf16 weights are for transformers; a resume reads the fp32 master weights saved beside
  // them, and the moments, bit for bit.
  EXPECT_EQ(hf_weights_dtype(saved.path), WeightsDtype::kBf16);
  EXPECT_TRUE(fs::exists(saved.path + "/master_weights.safetensors"));
  const Checkpoint loaded = load_checkpoint(run);
  EXPECT_EQ(loaded.model.params, params_);
  for (size_t i = 0; i < layout_.total_count(); ++i)
    ASSERT_EQ(loaded.state.adam_m[i], 1.0f + std::ldexp(1.0f, -20) * i) << i;
  // The disk a checkpoint is planned with covers what was written.
  EXPECT_GE(checkpoint_bytes(layout_, false, options.max_shard_bytes, WeightsDtype::kBf16).total(),
            saved.bytes);
  // An fp32 checkpoint needs no second copy of its weights.
  options.hf.dtype = WeightsDtype::kFp32;
  checkpoint.progress.step = 6;
  const SavedCheckpoint fp32 = save_checkpoint_streamed(run, config_, layout_, checkpoint, options);
  EXPECT_FALSE(fs::exists(fp32.path + "/master_weights.safetensors"));
  EXPECT_EQ(load_checkpoint(run).model.params, params_);

  // A failing save leaves no checkpoint of that step, its tokenizer files included.
  checkpoint.progress.step = 7;
  checkpoint.read_moments = [](AdamMoment, size_t, size_t, float*) { fail("disk full"); };
  EXPECT_TRUE(contains(
      error_message([&] { save_checkpoint_streamed(run, config_, layout_, checkpoint, options); }),
      "disk full"));
  EXPECT_FALSE(fs::exists(run + "/step-00000007"));
  EXPECT_FALSE(fs::exists(run + "/step-00000007.partial"));
  EXPECT_GT(moment_reads, 0u);
}

}  // namespace
}  // namespace layup
