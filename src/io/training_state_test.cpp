// Tests of the training-state file: exact round trip of every field, and errors for a state of
// another model or a damaged file.
#include "io/training_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

ModelConfig tiny_config(int n_layer = 1) {
  return gpt2_config(n_layer, 2, 8, 16, 50);
}

TrainingState random_state(const ParameterLayout& layout, int64_t step) {
  Rng rng(step + 1);
  TrainingState state;
  state.step = step;
  state.adam_m.resize(layout.total_count());
  state.adam_v.resize(layout.total_count());
  for (float& m : state.adam_m) m = rng.normal() * 1e-3f;
  for (float& v : state.adam_v) v = rng.uniform() * 1e-6f;
  state.data_rng_state = std::numeric_limits<uint64_t>::max() - 12345;
  state.tokens_seen = step * 4096;
  state.best_val_loss = 3.14159265358979;
  state.options = {{"lr", 6e-4}, {"batch", 4}, {"schedule", {{"warmup", 10}}}};
  return state;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class TrainingStateFile : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = random_state(layout_, 42);
    path_ = dir_.file("training_state.safetensors");
    save_training_state(path_, layout_, state_);
  }

  std::string load_error(const ParameterLayout& layout) {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] { load_training_state(path_, layout); });
    EXPECT_TRUE(contains(message, path_));
    EXPECT_EQ(snapshot(dir_.path()), before);
    return message;
  }

  // Rewrites the file with the same moments and `metadata` changed by `edit`.
  void rewrite(const std::function<void(std::map<std::string, std::string>&)>& edit,
               bool drop_v = false) {
    std::map<std::string, std::string> metadata = SafetensorsReader(path_).metadata();
    edit(metadata);
    std::vector<SafetensorsTensor> tensors = {
        {"adamw.m", {state_.adam_m.size()}, state_.adam_m.data(), {}}};
    if (!drop_v) tensors.push_back({"adamw.v", {state_.adam_v.size()}, state_.adam_v.data(), {}});
    write_safetensors(path_, tensors, metadata);
  }

  TempDir dir_;
  ParameterLayout layout_{tiny_config()};
  TrainingState state_;
  std::string path_;
};

TEST_F(TrainingStateFile, RoundTripIsExact) {
  const TrainingState loaded = load_training_state(path_, layout_);
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.data_rng_state, state_.data_rng_state);
  EXPECT_EQ(loaded.tokens_seen, 42 * 4096);
  EXPECT_TRUE(std::isnan(loaded.last_val_loss));
  EXPECT_EQ(loaded.best_val_loss, 3.14159265358979);
  EXPECT_EQ(loaded.options, state_.options);
  EXPECT_TRUE(same_floats(loaded.adam_m, state_.adam_m));
  EXPECT_TRUE(same_floats(loaded.adam_v, state_.adam_v));
  EXPECT_EQ(snapshot(dir_.path()).size(), 1u);
}

TEST_F(TrainingStateFile, StateOfAnotherModelNamesBothSizes) {
  const ParameterLayout bigger(tiny_config(2));
  const std::string message = load_error(bigger);
  EXPECT_TRUE(contains(message, "holds " + std::to_string(layout_.total_count()) + " values"));
  EXPECT_TRUE(contains(message, "the model has " + std::to_string(bigger.total_count())));
  EXPECT_TRUE(contains(message, "different model"));
}

TEST_F(TrainingStateFile, SavingMomentsOfWrongLengthWritesNothing) {
  TempDir other;
  TrainingState state = state_;
  state.adam_v.pop_back();
  const std::string message =
      error_message([&] { save_training_state(other.file("s.safetensors"), layout_, state); });
  EXPECT_TRUE(contains(message, "hold " + std::to_string(layout_.total_count()) + " and " +
                                    std::to_string(layout_.total_count() - 1) + " values"));
  EXPECT_TRUE(snapshot(other.path()).empty());
}

TEST_F(TrainingStateFile, CorruptedScalars) {
  rewrite([](auto& metadata) { metadata["step"] = "12x"; });
  EXPECT_TRUE(contains(load_error(layout_), "metadata entry \"step\" is '12x'"));
  rewrite([](auto& metadata) { metadata["step"] = "-5"; });
  EXPECT_TRUE(contains(load_error(layout_), "negative step (-5)"));
  rewrite([](auto& metadata) {
    metadata["step"] = "5";
    metadata.erase("data_rng_state");
  });
  EXPECT_TRUE(contains(load_error(layout_), "has no \"data_rng_state\" entry"));
}

TEST_F(TrainingStateFile, CorruptedOptions) {
  rewrite([](auto& metadata) { metadata["options"] = "{\"lr\": "; });
  EXPECT_TRUE(contains(load_error(layout_), "\"options\" is not valid JSON"));
}

TEST_F(TrainingStateFile, NotATrainingState) {
  rewrite([](auto& metadata) { metadata["format"] = "pt"; });
  EXPECT_TRUE(contains(load_error(layout_),
                       "is not a layup training state (its metadata has "
                       "format 'pt'"));
  rewrite([](auto& metadata) {
    metadata["format"] = "layup-training-state";
    metadata["format_version"] = "9";
  });
  EXPECT_TRUE(contains(load_error(layout_), "format version 9"));
}

TEST_F(TrainingStateFile, MissingMoment) {
  rewrite([](auto&) {}, /*drop_v=*/true);
  EXPECT_TRUE(contains(load_error(layout_), "has no tensor 'adamw.v'"));
}

TEST_F(TrainingStateFile, MomentsNoAdamWRunCanProduceAreNamed) {
  const TensorSpec& ln_1 =
      *std::find_if(layout_.tensors().begin(), layout_.tensors().end(),
                    [](const TensorSpec& spec) { return spec.name == "h.0.ln_1.weight"; });
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<float> TrainingState::*moment;
    float value;
    std::string expected;
  };
  const std::string at = " at index " + std::to_string(ln_1.offset + 3) + " (h.0.ln_1.weight, " +
                         "element 3); AdamW's ";
  const Case cases[] = {
      {&TrainingState::adam_m, nan, "tensor 'adamw.m' holds nan" + at + "first moments"},
      {&TrainingState::adam_m, -inf, "tensor 'adamw.m' holds -inf" + at + "first moments"},
      {&TrainingState::adam_v, inf, "tensor 'adamw.v' holds inf" + at + "second moments"},
      {&TrainingState::adam_v, -0.25f, "tensor 'adamw.v' holds -0.25" + at + "second moments"},
  };
  for (const Case& c : cases) {
    const TrainingState good = state_;
    (state_.*c.moment)[ln_1.offset + 3] = c.value;
    rewrite([](auto&) {});
    const std::string message = load_error(layout_);
    EXPECT_TRUE(contains(message, c.expected));
    EXPECT_TRUE(contains(message, "resume from an earlier checkpoint"));
    state_ = good;
  }
  // Negative first moments and a zero second moment are normal.
  state_.adam_m[0] = -1.0f;
  state_.adam_v[0] = 0.0f;
  rewrite([](auto&) {});
  EXPECT_NO_THROW(load_training_state(path_, layout_));
}

TEST_F(TrainingStateFile, TruncatedFile) {
  const std::string bytes = read_text(path_);
  write_text(path_, bytes.substr(0, bytes.size() - 4));
  EXPECT_TRUE(contains(load_error(layout_), "beyond the end of the data section"));
}

// The sharded state: per-tensor moments in optimizer-*-of-*.safetensors, scalars in the index.
class TrainingStateSharded : public ::testing::Test {
 protected:
  static constexpr size_t kMaxShardBytes = 2048;  // wte's moments (4096 bytes each) stand alone
  static constexpr size_t kChunkBytes = 256;      // 64 floats

  void SetUp() override {
    state_ = random_state(layout_, 42);
    save();
  }

  // Saves state_ sharded into dir_; returns the largest read.
  size_t save(size_t max_shard_bytes = kMaxShardBytes) {
    size_t largest = 0;
    save_training_state_sharded(
        dir_.path(), layout_, state_,
        [&](AdamMoment moment, size_t offset, size_t count, float* out) {
          largest = std::max(largest, count);
          const std::vector<float>& values =
              moment == AdamMoment::kFirst ? state_.adam_m : state_.adam_v;
          std::memcpy(out, values.data() + offset, count * sizeof(float));
        },
        max_shard_bytes, kChunkBytes);
    return largest;
  }

  // Loads into whole vectors, checking that each moment element is written once.
  TrainingState load(const ParameterLayout& layout) {
    TrainingState loaded;
    loaded.adam_m.assign(layout.total_count(), std::numeric_limits<float>::quiet_NaN());
    loaded.adam_v.assign(layout.total_count(), std::numeric_limits<float>::quiet_NaN());
    std::vector<int> writes_m(layout.total_count()), writes_v(layout.total_count());
    static_cast<TrainingProgress&>(loaded) = load_training_state_sharded(
        dir_.path(), layout,
        [&](AdamMoment moment, size_t offset, size_t count, const float* in) {
          EXPECT_LE(count, kChunkBytes / sizeof(float));
          const bool first = moment == AdamMoment::kFirst;
          std::memcpy((first ? loaded.adam_m : loaded.adam_v).data() + offset, in,
                      count * sizeof(float));
          for (size_t i = offset; i < offset + count; ++i) ++(first ? writes_m : writes_v)[i];
        },
        kChunkBytes);
    EXPECT_EQ(writes_m, std::vector<int>(layout.total_count(), 1));
    EXPECT_EQ(writes_v, std::vector<int>(layout.total_count(), 1));
    return loaded;
  }

  std::string load_error(const ParameterLayout& layout) {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] {
      load_training_state_sharded(dir_.path(), layout,
                                  [](AdamMoment, size_t, size_t, const float*) {});
    });
    EXPECT_EQ(snapshot(dir_.path()), before);
    return message;
  }

  std::vector<std::string> file_names() {
    std::vector<std::string> names;
    for (const auto& [name, contents] : snapshot(dir_.path())) names.push_back(name);
    return names;
  }

  TempDir dir_;
  ParameterLayout layout_{tiny_config()};
  TrainingState state_;
  std::string index_path_ = dir_.file("optimizer.safetensors.index.json");
};

TEST_F(TrainingStateSharded, RoundTripThroughSeveralShardsIsExact) {
  EXPECT_EQ(save(), kChunkBytes / sizeof(float));
  const std::vector<std::string> names = file_names();
  ASSERT_GT(names.size(), 3u);
  EXPECT_EQ(names.front(), "optimizer-00001-of-" + names.front().substr(19, 5) + ".safetensors");
  EXPECT_EQ(names.back(), "optimizer.safetensors.index.json");
  EXPECT_TRUE(has_sharded_training_state(dir_.path()));

  const nlohmann::json index = nlohmann::json::parse(read_text(index_path_));
  EXPECT_EQ(index["metadata"]["total_size"], 2 * layout_.total_count() * sizeof(float));
  EXPECT_EQ(index["metadata"]["format"], "layup-training-state");
  EXPECT_EQ(index["metadata"]["step"], "42");
  EXPECT_EQ(index["weight_map"].size(), 2 * layout_.tensors().size());
  EXPECT_EQ(index["weight_map"]["adamw.m.wte.weight"], names.front());
  EXPECT_EQ(index["weight_map"]["adamw.v.wte.weight"], names[1]);  // larger than a shard: alone
  const SafetensorsReader first_shard(dir_.file(names.front()));
  EXPECT_EQ(first_shard.metadata().at("format"), "layup-training-state-shard");
  EXPECT_EQ(first_shard.tensors()[0].shape, (std::vector<size_t>{128, 8}));  // padded rows too

  const TrainingState loaded = load(layout_);
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.data_rng_state, state_.data_rng_state);
  EXPECT_EQ(loaded.tokens_seen, 42 * 4096);
  EXPECT_TRUE(std::isnan(loaded.last_val_loss));
  EXPECT_EQ(loaded.best_val_loss, 3.14159265358979);
  EXPECT_EQ(loaded.options, state_.options);
  EXPECT_TRUE(same_floats(loaded.adam_m, state_.adam_m));
  EXPECT_TRUE(same_floats(loaded.adam_v, state_.adam_v));
}

TEST_F(TrainingStateSharded, EachSaveRemovesTheStateItReplaces) {
  save_training_state(dir_.file("training_state.safetensors"), layout_, state_);
  const size_t shard_count = file_names().size() - 2;
  save(1 << 20);  // one shard, and still an index
  EXPECT_EQ(file_names(), (std::vector<std::string>{"optimizer-00001-of-00001.safetensors",
                                                    "optimizer.safetensors.index.json"}));
  EXPECT_GT(shard_count, 1u);
  EXPECT_TRUE(same_floats(load(layout_).adam_v, state_.adam_v));
}

TEST_F(TrainingStateSharded, FailedSaveLeavesTheOldStateAsItWas) {
  const auto before = snapshot(dir_.path());
  size_t calls = 0;
  const std::string message = error_message([&] {
    save_training_state_sharded(
        dir_.path(), layout_, state_,
        [&](AdamMoment, size_t, size_t count, float* out) {
          if (++calls == 40) fail("the disk tier could not be read");
          std::fill(out, out + count, 0.0f);
        },
        kMaxShardBytes, kChunkBytes);
  });
  EXPECT_EQ(message, "the disk tier could not be read");
  EXPECT_EQ(snapshot(dir_.path()), before);
}

TEST_F(TrainingStateSharded, StateOfAnotherModelNamesBothSizes) {
  const ParameterLayout bigger(tiny_config(2));
  const std::string message = load_error(bigger);
  EXPECT_TRUE(contains(message, index_path_ + " is the state of a model of " +
                                    std::to_string(layout_.total_count()) + " parameters"));
  EXPECT_TRUE(contains(message, "the model has " + std::to_string(bigger.total_count())));
}

TEST_F(TrainingStateSharded, MomentsNoAdamWRunCanProduceNameTheShard) {
  const TensorSpec& ln_1 =
      *std::find_if(layout_.tensors().begin(), layout_.tensors().end(),
                    [](const TensorSpec& spec) { return spec.name == "h.0.ln_1.weight"; });
  state_.adam_v[ln_1.offset + 3] = -0.25f;
  save();
  const std::string shard =
      nlohmann::json::parse(read_text(index_path_))["weight_map"]["adamw.v.h.0.ln_1.weight"];
  const std::string message = load_error(layout_);
  EXPECT_TRUE(contains(message, dir_.file(shard) + ": tensor 'adamw.v.h.0.ln_1.weight' holds "
                                                   "-0.25 at index 3 (h.0.ln_1.weight, element "
                                                   "3); AdamW's second moments"));
}

TEST_F(TrainingStateSharded, DamagedIndexOrMissingShard) {
  const std::string original = read_text(index_path_);
  nlohmann::json index = nlohmann::json::parse(original);
  index["metadata"]["step"] = "12x";
  write_text(index_path_, index.dump());
  EXPECT_TRUE(contains(load_error(layout_), index_path_ + ": metadata entry \"step\" is '12x'"));
  index["metadata"]["step"] = 12;
  write_text(index_path_, index.dump());
  EXPECT_TRUE(contains(load_error(layout_), "metadata entry \"step\" is 12 instead of a string"));
  index["metadata"]["step"] = "12";
  index["weight_map"].erase("adamw.m.ln_f.bias");
  write_text(index_path_, index.dump());
  EXPECT_TRUE(contains(load_error(layout_), "does not list"));  // still in its shard

  write_text(index_path_, original);
  const std::string shard = dir_.file(file_names()[1]);
  std::filesystem::remove(shard);
  EXPECT_TRUE(contains(load_error(layout_), shard + " does not exist"));
}

}  // namespace
}  // namespace layup
