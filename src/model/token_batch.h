// A batch of token ids as every layer above the model sees it: the data folder makes them, the
// backends compute on them, the schedules and the sampler pass them on.
#pragma once

#include <cstdint>

namespace layup {

// A target id below 0 is not learned: its position adds nothing to the loss or the gradient
// (transformers' labels of -100). The data folder writes this one.
inline constexpr int32_t kNotLearned = -1;

// B sequences of T token ids. targets may be null for inference (no loss, no backward).
// With targets, a batch's loss is the mean cross-entropy over its learned targets; a batch with
// none learned has loss 0 and gradient 0.
struct TokenBatch {
  const int32_t* inputs = nullptr;   // [B, T]
  const int32_t* targets = nullptr;  // [B, T] or null; kNotLearned (< 0) where not learned
  int batch = 0;                     // B
  int seq_len = 0;                   // T
};

// The targets of `count` that are learned (>= 0): the divisor of a batch's mean loss.
inline int learned_target_count(const int32_t* targets, int count) {
  int learned = 0;
  for (int i = 0; i < count; ++i) learned += targets[i] >= 0 ? 1 : 0;
  return learned;
}

}  // namespace layup
