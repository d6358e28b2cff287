// Pins sampling: top-k never leaves the k likeliest tokens, the padded vocabulary is never drawn,
// the context window slides; and what stops generation: a stop token (not kept), a stop text
// (kept), a full cache.
#include "sample/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace layup {
namespace {

constexpr int kVocab = 10, kPadded = 16;

TEST(Generate, TopKKeepsToTheLikeliestTokensAndSkipsPadding) {
  std::vector<float> logits(kPadded, 0.0f);
  logits[3] = 5.0f;
  logits[7] = 4.9f;
  for (int i = kVocab; i < kPadded; ++i) logits[i] = 100.0f;  // padding must never win
  int calls = 0;
  const LogitsFunction same = [&](const TokenBatch& batch) {
    ++calls;
    EXPECT_LE(batch.seq_len, 4);
    static std::vector<float> rows;
    rows.assign(static_cast<size_t>(batch.seq_len) * kPadded, 0.0f);
    std::copy(logits.begin(), logits.end(), rows.end() - kPadded);
    return rows.data();
  };
  Rng rng(3);
  const std::vector<int32_t> out = generate(same, {1}, 4, kVocab, kPadded, {50, 1.0f, 2}, rng);
  ASSERT_EQ(out.size(), 51u);
  EXPECT_EQ(calls, 50);
  std::set<int32_t> drawn(out.begin() + 1, out.end());
  EXPECT_EQ(drawn, (std::set<int32_t>{3, 7}));
}

TEST(Generate, SameSeedSameText) {
  std::vector<float> rows;
  const LogitsFunction uniform = [&](const TokenBatch& batch) {
    rows.assign(static_cast<size_t>(batch.seq_len) * kPadded, 0.0f);
    return rows.data();
  };
  Rng a(9), b(9);
  EXPECT_EQ(generate(uniform, {0}, 8, kVocab, kPadded, {20, 0.7f, 0}, a),
            generate(uniform, {0}, 8, kVocab, kPadded, {20, 0.7f, 0}, b));
}

// Greedy text that spells the tokens of `script` in turn (one-hot logits), and counts what it was
// given; room for `room` appends after the prompt.
class ScriptedModel final : public NextTokenModel {
 public:
  ScriptedModel(std::vector<int32_t> script, int room) : script_(std::move(script)), room_(room) {}
  const float* append(std::span<const int32_t> tokens) override {
    appended_ += static_cast<int>(tokens.size());
    ++calls_;
    logits_.assign(kPadded, 0.0f);
    logits_[script_.at(calls_ - 1)] = 10.0f;
    return logits_.data();
  }
  bool has_room() const override { return calls_ <= room_; }
  int appended_ = 0, calls_ = 0;

 private:
  std::vector<int32_t> script_;
  int room_;
  std::vector<float> logits_;
};

const SamplingOptions kGreedy{8, 1.0f, 1};

TEST(Generate, StopsAtAStopTokenWithoutKeepingIt) {
  ScriptedModel model({4, 5, 9, 6, 6, 6}, 100);
  Rng rng(1);
  const std::vector<int32_t> prompt = {1, 2, 3};
  const GenerationResult result = generate(model, prompt, kVocab, kGreedy, {{9, 8}, {}, {}}, rng);
  EXPECT_EQ(result.tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(result.reason, StopReason::kStopToken);
  EXPECT_EQ(model.appended_, 5);  // the prompt, then 4 and 5
}

TEST(Generate, StopsAfterTheTokenThatCompletesAStopText) {
  ScriptedModel model({1, 2, 3, 4, 5, 6, 7}, 100);
  const auto spell = [](std::span<const int32_t> ids) {
    std::string text;
    for (int32_t id : ids) text += static_cast<char>('a' + id);  // 1 -> "b", 2 -> "c", ...
    return text;
  };
  Rng rng(1);
  const std::vector<int32_t> prompt = {0};
  GenerationResult result = generate(model, prompt, kVocab, kGreedy, {{}, {"x", "cd"}, spell}, rng);
  EXPECT_EQ(result.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(result.reason, StopReason::kStopText);
  ScriptedModel unstopped({1, 2, 3, 4, 5, 6, 7, 8, 9}, 100);
  result = generate(unstopped, prompt, kVocab, kGreedy, {{}, {"zz"}, spell}, rng);
  EXPECT_EQ(result.tokens.size(), 8u);
  EXPECT_EQ(result.reason, StopReason::kTokenLimit);
}

// A prompt longer than the cache keeps its last positions: the window the recomputed model starts
// from, and the same logits within float rounding; then the cache has no room.
TEST(Generate, KvCacheModelKeepsAPromptsLastPositions) {
  const ModelConfig config = gpt2_config(2, 2, 16, 16, 61);
  const ParameterLayout layout(config);
  std::vector<float> params(layout.total_count());
  Rng rng(3);
  for (float& value : params) value = 0.3f * rng.normal();
  const ParameterPointers pointers = layout.pointers<const float>(params.data());
  std::vector<int32_t> prompt(20);
  for (int32_t& token : prompt) token = static_cast<int32_t>(rng.below(61));

  const std::unique_ptr<ModelBackend> full = make_cpu_backend(config, 1, 16);
  RecomputeModel recomputed(
      [&](const TokenBatch& batch) {
        full->forward(pointers, batch);
        return full->logits();
      },
      16, config.padded_vocab_size);
  const float* expected = recomputed.append(prompt);
  const std::unique_ptr<ModelBackend> pieces = make_cpu_backend(config, 1, 6);
  KvCacheModel cached(*pieces, pointers, 16, 6);
  const float* actual = cached.append(prompt);
  for (int v = 0; v < config.vocab_size; ++v)
    EXPECT_NEAR(actual[v], expected[v], 1e-4 * (1.0 + std::fabs(expected[v])));
  EXPECT_EQ(pieces->decoded_positions(), 16);
  EXPECT_FALSE(cached.has_room());
}

TEST(Generate, StopsWhenTheModelHasNoRoom) {
  ScriptedModel model({1, 2, 3, 4, 5, 6, 7}, 2);
  Rng rng(1);
  const std::vector<int32_t> prompt = {0};
  const GenerationResult result = generate(model, prompt, kVocab, kGreedy, {}, rng);
  EXPECT_EQ(result.tokens, (std::vector<int32_t>{1, 2, 3}));  // the third needs no room
  EXPECT_EQ(result.reason, StopReason::kContextFull);
}

}  // namespace
}  // namespace layup
