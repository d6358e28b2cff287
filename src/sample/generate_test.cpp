// Pins sampling: top-k never leaves the k likeliest tokens, the padded vocabulary is never drawn,
// and the context window slides.
#include "sample/generate.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace layup
