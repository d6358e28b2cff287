// Text generation from a trained model: temperature and top-k sampling, one token at a time, from
// a key/value cache or by recomputing the window, until a token limit, a stop token or stop text.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/model_backend.h"
#include "core/rng.h"

namespace layup {

struct SamplingOptions {
  int new_tokens = 64;
  float temperature = 1.0f;
  int top_k = 0;  // 0: sample from the whole vocabulary
};

// What continues a sequence: the logits of the token after everything it was given.
class NextTokenModel {
 public:
  virtual ~NextTokenModel() = default;
  // Takes the sequence's next tokens (the prompt first, then each sampled token) and returns the
  // logits of the token after them, [padded_vocab], valid until the next call.
  virtual const float* append(std::span<const int32_t> tokens) = 0;
  // Whether one more token can be appended.
  virtual bool has_room() const = 0;
};

// Produces the logits of a batch of one sequence ([1, T, padded_vocab]).
using LogitsFunction = std::function<const float*(const TokenBatch&)>;

// Runs the whole window, the last `context` tokens, for every new token: past the context the
// window slides (each position then sees fewer tokens before it than at the start).
class RecomputeModel final : public NextTokenModel {
 public:
  RecomputeModel(LogitsFunction logits_of, int context, int padded_vocab_size)
      : logits_of_(std::move(logits_of)), context_(context), padded_vocab_(padded_vocab_size) {}
  const float* append(std::span<const int32_t> tokens) override;
  bool has_room() const override { return true; }

 private:
  LogitsFunction logits_of_;
  int context_, padded_vocab_;
  std::vector<int32_t> tokens_;
};

// The backend's key/value cache (ModelBackend::decode) of `max_positions` positions: a prompt in
// pieces of up to `piece_tokens` (the backend's max_seq_len), then one token at a time. A prompt
// longer than the cache keeps its last max_positions tokens (the window RecomputeModel starts
// from); a full cache has no room: positions are absolute, so it cannot slide.
class KvCacheModel final : public NextTokenModel {
 public:
  KvCacheModel(ModelBackend& backend, const ParameterPointers& params, int max_positions,
               int piece_tokens);
  const float* append(std::span<const int32_t> tokens) override;
  bool has_room() const override { return backend_.decoded_positions() < max_positions_; }

 private:
  ModelBackend& backend_;
  const ParameterPointers& params_;
  int max_positions_, piece_tokens_;
};

// What ends generation before the token limit: one of `token_ids` sampled (EOS; the token is not
// part of the result), or one of `texts` appearing in the decoded continuation (the token that
// completes it is kept). `decode` spells tokens; needed only with texts.
struct StopConditions {
  std::vector<int32_t> token_ids;
  std::vector<std::string> texts;
  std::function<std::string(std::span<const int32_t>)> decode;
};

enum class StopReason { kTokenLimit, kStopToken, kStopText, kContextFull };

struct GenerationResult {
  std::vector<int32_t> tokens;  // the continuation only
  StopReason reason = StopReason::kTokenLimit;
  int prompt_tokens = 0;       // the prompt's
  double prefill_seconds = 0;  // the prompt's forward
  double decode_seconds = 0;   // every later token's forward and sampling
};

// Continues `prompt` (at least one token) by sampling up to options.new_tokens tokens. Only the
// real vocabulary (vocab_size) is sampled.
GenerationResult generate(NextTokenModel& model, std::span<const int32_t> prompt, int vocab_size,
                          const SamplingOptions& options, const StopConditions& stop, Rng& rng);

// The same by recomputing (RecomputeModel), with no stop: the prompt followed by the new tokens.
std::vector<int32_t> generate(const LogitsFunction& logits_of, std::vector<int32_t> prompt,
                              int context, int vocab_size, int padded_vocab_size,
                              const SamplingOptions& options, Rng& rng);

}  // namespace layup
