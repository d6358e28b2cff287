// Temperature + top-k sampling over the model's next-token distribution.
#include "sample/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace layup {

namespace {

// Draws an index from softmax(logits / temperature), restricted to the top_k largest logits.
int32_t sample_token(const float* logits, int vocab_size, const SamplingOptions& options,
                     Rng& rng) {
  std::vector<int32_t> candidates(vocab_size);
  std::iota(candidates.begin(), candidates.end(), 0);
  if (options.top_k > 0 && options.top_k < vocab_size) {
    std::partial_sort(candidates.begin(), candidates.begin() + options.top_k, candidates.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    candidates.resize(options.top_k);
  }
  float max_logit = -INFINITY;
  for (int32_t id : candidates) max_logit = std::max(max_logit, logits[id]);
  std::vector<double> weights(candidates.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    weights[i] = std::exp((logits[candidates[i]] - max_logit) / options.temperature);
    total += weights[i];
  }
  double target = rng.uniform() * total;
  for (size_t i = 0; i < candidates.size(); ++i) {
    target -= weights[i];
    if (target < 0.0) return candidates[i];
  }
  return candidates.back();
}

}  // namespace

std::vector<int32_t> generate(const LogitsFunction& logits_of, std::vector<int32_t> prompt,
                              int context, int vocab_size, int padded_vocab_size,
                              const SamplingOptions& options, Rng& rng) {
  LAYUP_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  std::vector<int32_t> tokens = std::move(prompt);
  for (int i = 0; i < options.new_tokens; ++i) {
    const int length = std::min<int>(static_cast<int>(tokens.size()), context);
    TokenBatch batch;
    batch.inputs = tokens.data() + tokens.size() - length;
    batch.batch = 1;
    batch.seq_len = length;
    const float* logits = logits_of(batch) + static_cast<size_t>(length - 1) * padded_vocab_size;
    tokens.push_back(sample_token(logits, vocab_size, options, rng));
  }
  return tokens;
}

}  // namespace layup
