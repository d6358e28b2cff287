// For tests: one training step on random tokens (the inputs doubling as targets), so that a
// schedule has allocated what its first step allocates.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "schedule/schedule.h"

namespace layup {

// `micro_batches` micro-batches of batch x seq_len tokens from a fixed seed; clip <= 0: none.
inline StepStats random_step(Schedule& schedule, const ModelConfig& config, int batch, int seq_len,
                             int micro_batches, float clip) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> tokens(micro_batches);
  std::vector<TokenBatch> batches;
  for (std::vector<int32_t>& t : tokens) {
    t.resize(static_cast<size_t>(batch) * seq_len);
    for (int32_t& id : t) id = static_cast<int32_t>(rng() % config.vocab_size);
    batches.push_back({t.data(), t.data(), batch, seq_len});
  }
  UpdateSettings settings;
  settings.adamw.hyper = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  settings.adamw.t = 1;
  settings.clip_max_norm = clip;
  return schedule.step(batches, settings);
}

}  // namespace layup
