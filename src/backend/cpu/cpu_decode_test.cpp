// The CPU backend's key/value-cache decode against its full forward: the logits of every position,
// reached by a prompt in pieces and then one token at a time, on a tiny GPT-2 and a tiny Llama
// with grouped K/V heads, biases and llama3 rope scaling.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace layup {
namespace {

std::vector<float> random_parameters(const ParameterLayout& layout, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> params(layout.total_count());
  for (float& value : params) value = 0.3f * rng.normal();
  return params;
}

ModelConfig tiny_llama() {
  ModelConfig config = llama_config(2, 4, 2, 32, 48, 16, 61);
  config.attention_bias = true;
  config.rope_scaling = {true, 8.0f, 1.0f, 4.0f, 4};
  config.rope_theta = 500000.0f;
  return config;
}

// Feeds `tokens` to a decode in pieces of `pieces` tokens, comparing each piece's last logits with
// the full forward's row of that position. The sums run in another order: agreement within 1e-4
// of the logits' scale.
void expect_decode_matches_forward(const ModelConfig& config, const std::vector<int>& pieces) {
  const ParameterLayout layout(config);
  const std::vector<float> params = random_parameters(layout, 5);
  const ParameterPointers pointers = layout.pointers<const float>(params.data());
  std::vector<int32_t> tokens;
  Rng rng(11);
  for (int piece : pieces)
    for (int i = 0; i < piece; ++i) tokens.push_back(static_cast<int32_t>(rng.below(61)));
  const int T = static_cast<int>(tokens.size());

  CpuBackend full(config, 1, T);
  full.forward(pointers, TokenBatch{tokens.data(), nullptr, 1, T});
  const std::vector<float> expected(
      full.logits(), full.logits() + static_cast<size_t>(T) * config.padded_vocab_size);

  CpuBackend cached(config, 1, 5);              // pieces of up to 5 tokens
  for (int repeat = 0; repeat < 2; ++repeat) {  // start_decode empties the cache
    cached.start_decode(config.n_positions);
    int position = 0;
    for (int piece : pieces) {
      const float* logits =
          cached.decode(pointers, std::span<const int32_t>(tokens.data() + position, piece));
      position += piece;
      EXPECT_EQ(cached.decoded_positions(), position);
      const float* row =
          expected.data() + static_cast<size_t>(position - 1) * config.padded_vocab_size;
      for (int v = 0; v < config.vocab_size; ++v)
        ASSERT_NEAR(logits[v], row[v], 1e-4 * (1.0 + std::fabs(row[v])))
            << "position " << position - 1 << ", logit " << v;
    }
  }
}

TEST(CpuDecode, Gpt2CachedLogitsAreTheForwards) {
  expect_decode_matches_forward(gpt2_config(2, 2, 16, 16, 61), {5, 3, 1, 1, 1, 1, 4});
}

TEST(CpuDecode, LlamaWithGroupedHeadsCachedLogitsAreTheForwards) {
  expect_decode_matches_forward(tiny_llama(), {4, 5, 1, 1, 1, 2, 1});
}

TEST(CpuDecode, RefusesWhatDoesNotFitTheCache) {
  const ModelConfig config = gpt2_config(2, 2, 16, 16, 61);
  const ParameterLayout layout(config);
  const std::vector<float> params = random_parameters(layout, 5);
  const ParameterPointers pointers = layout.pointers<const float>(params.data());
  CpuBackend backend(config, 1, 4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  EXPECT_THROW(backend.decode(pointers, tokens), Error);  // no start_decode
  EXPECT_THROW(backend.start_decode(17), Error);          // beyond the model's context
  backend.start_decode(6);
  backend.decode(pointers, tokens);
  EXPECT_THROW(backend.decode(pointers, tokens), Error);  // 8 positions in a cache of 6
  backend.decode(pointers, std::span<const int32_t>(tokens.data(), 2));
  EXPECT_EQ(backend.decoded_positions(), 6);
}

}  // namespace
}  // namespace layup
