// Everything besides the weights that a run needs to resume bit-exactly, in one file:
// training_state.safetensors.
//
// The AdamW moments are two tensors, "adamw.m" and "adamw.v", each one flat vector in the order of
// the parameter layout (padded embedding rows included). The scalars (step, data sampler RNG
// state, tokens seen, losses) and the run's options are strings in the file's "__metadata__",
// integers in decimal and floating-point values in their shortest round-trip form, so they come
// back exactly. Using safetensors keeps the file inspectable with standard tools.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/parameter_layout.h"

namespace layup {

inline constexpr const char* kTrainingStateFileName = "training_state.safetensors";

struct TrainingState {
  int64_t step = 0;             // optimizer steps taken (AdamW's bias correction uses it)
  std::vector<float> adam_m;    // first moments, layout.total_count() floats
  std::vector<float> adam_v;    // second moments, layout.total_count() floats
  uint64_t data_rng_state = 0;  // BatchSampler::state() after the last batch drawn
  int64_t tokens_seen = 0;
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not measured yet
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();
  nlohmann::json options = nlohmann::json::object();  // the run's settings, as the trainer sees fit
};

// Writes the state to `path` atomically. The moments must have layout.total_count() floats.
void save_training_state(const std::string& path, const ParameterLayout& layout,
                         const TrainingState& state);

// Reads and validates a training state for a model of `layout`: format tag, every scalar, the
// options JSON, moment lengths equal to layout.total_count() (an error names both numbers), and
// moments AdamW can produce: finite, the second ones not negative (an error names the first
// offending index, its parameter and value).
TrainingState load_training_state(const std::string& path, const ParameterLayout& layout);

}  // namespace layup
