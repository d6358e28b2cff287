// Text generation from a trained model: temperature and top-k sampling, one token at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/model_backend.h"
#include "core/rng.h"

namespace layup {

struct SamplingOptions {
  int new_tokens = 64;
  float temperature = 1.0f;
  int top_k = 0;  // 0: sample from the whole vocabulary
};

// Produces the logits of a batch of one sequence ([1, T, padded_vocab]).
using LogitsFunction = std::function<const float*(const TokenBatch&)>;

// Continues `prompt` by sampling `new_tokens` tokens. The context fed to the model is the last
// `context` tokens (the model's positions). Only the real vocabulary (vocab_size) is sampled.
std::vector<int32_t> generate(const LogitsFunction& logits_of, std::vector<int32_t> prompt,
                              int context, int vocab_size, int padded_vocab_size,
                              const SamplingOptions& options, Rng& rng);

}  // namespace layup
