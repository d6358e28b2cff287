// Temperature + top-k sampling over the model's next-token distribution, and the two ways of
// getting it: a key/value cache, or the whole window recomputed for every token.
#include "sample/generate.h"

#include <algorithm>
#include <chrono>
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

// Whether a stop text ends in the continuation's last tokens: only those are decoded, enough of
// them for the longest text (a token spells one byte at least, a special token perhaps none).
bool ends_in_stop_text(const std::vector<int32_t>& tokens, const StopConditions& stop) {
  if (stop.texts.empty()) return false;
  size_t longest = 0;
  for (const std::string& text : stop.texts) longest = std::max(longest, text.size());
  const size_t tail = std::min(tokens.size(), longest + 16);
  const std::string spelled =
      stop.decode(std::span<const int32_t>(tokens.data() + tokens.size() - tail, tail));
  for (const std::string& text : stop.texts)
    if (!text.empty() && spelled.find(text) != std::string::npos) return true;
  return false;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const float* RecomputeModel::append(std::span<const int32_t> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  const int length = std::min<int>(static_cast<int>(tokens_.size()), context_);
  TokenBatch batch;
  batch.inputs = tokens_.data() + tokens_.size() - length;
  batch.batch = 1;
  batch.seq_len = length;
  return logits_of_(batch) + static_cast<size_t>(length - 1) * padded_vocab_;
}

KvCacheModel::KvCacheModel(ModelBackend& backend, const ParameterPointers& params,
                           int max_positions, int piece_tokens)
    : backend_(backend),
      params_(params),
      max_positions_(max_positions),
      piece_tokens_(piece_tokens) {
  LAYUP_CHECK(piece_tokens >= 1, "a prompt is decoded in pieces of at least one token");
  backend_.start_decode(max_positions);
}

const float* KvCacheModel::append(std::span<const int32_t> tokens) {
  LAYUP_CHECK(!tokens.empty(), "nothing to append");
  if (backend_.decoded_positions() == 0 && static_cast<int>(tokens.size()) > max_positions_)
    tokens = tokens.last(max_positions_);
  const float* logits = nullptr;
  for (size_t first = 0; first < tokens.size(); first += piece_tokens_) {
    const size_t count = std::min<size_t>(piece_tokens_, tokens.size() - first);
    logits = backend_.decode(params_, tokens.subspan(first, count));
  }
  return logits;
}

GenerationResult generate(NextTokenModel& model, std::span<const int32_t> prompt, int vocab_size,
                          const SamplingOptions& options, const StopConditions& stop, Rng& rng) {
  LAYUP_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  GenerationResult result;
  auto start = std::chrono::steady_clock::now();
  const float* logits = model.append(prompt);
  result.prefill_seconds = seconds_since(start);
  result.prompt_tokens = static_cast<int>(prompt.size());
  start = std::chrono::steady_clock::now();
  while (true) {
    const int32_t token = sample_token(logits, vocab_size, options, rng);
    if (std::find(stop.token_ids.begin(), stop.token_ids.end(), token) != stop.token_ids.end()) {
      result.reason = StopReason::kStopToken;
      break;
    }
    result.tokens.push_back(token);
    if (ends_in_stop_text(result.tokens, stop)) {
      result.reason = StopReason::kStopText;
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= options.new_tokens) break;
    if (!model.has_room()) {
      result.reason = StopReason::kContextFull;
      break;
    }
    logits = model.append(std::span<const int32_t>(&result.tokens.back(), 1));
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

std::vector<int32_t> generate(const LogitsFunction& logits_of, std::vector<int32_t> prompt,
                              int context, int vocab_size, int padded_vocab_size,
                              const SamplingOptions& options, Rng& rng) {
  RecomputeModel model(logits_of, context, padded_vocab_size);
  const GenerationResult result = generate(model, prompt, vocab_size, options, {}, rng);
  prompt.insert(prompt.end(), result.tokens.begin(), result.tokens.end());
  return prompt;
}

}  // namespace layup
