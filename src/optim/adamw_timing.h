// Timing AdamW updates: what `layup bench-adamw` prints and `layup calibrate` keeps as the
// CPU's AdamW rate (engine/calibration.h).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

#include "optim/adamw.h"

namespace layup {

constexpr int kAdamWWarmupUpdates = 2;

struct AdamWTiming {
  std::vector<double> seconds;  // every timed update, in order
  double median_s = 0.0, best_s = 0.0;
};

inline AdamWTiming summarize_timing(std::vector<double> seconds) {
  AdamWTiming timing;
  timing.seconds = seconds;
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  timing.median_s = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  timing.best_s = seconds.front();
  return timing;
}

// Times kAdamWWarmupUpdates untimed then `repeats` timed calls of update(step), more while the
// timed calls have taken less than min_seconds, with GPT-2's hyperparameters and t counting up;
// calls after_warmup in between.
template <class Update, class AfterWarmup>
AdamWTiming time_adamw_updates(int repeats, Update update, AfterWarmup after_warmup,
                               double min_seconds = 0.0) {
  AdamWStep step;
  step.hyper = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (int i = 0; i < kAdamWWarmupUpdates; ++i) {
    step.t = i + 1;
    update(step);
  }
  after_warmup();
  std::vector<double> seconds;
  double total_s = 0.0;
  for (int i = 0; i < repeats || total_s < min_seconds; ++i) {
    step.t = kAdamWWarmupUpdates + i + 1;
    const auto start = std::chrono::steady_clock::now();
    update(step);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    total_s += seconds.back();
  }
  return summarize_timing(seconds);
}

}  // namespace layup
