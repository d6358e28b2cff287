// Warmup + cosine learning-rate schedule.
#include "optim/lr_schedule.h"

#include <cmath>

namespace layup {

float LrSchedule::at(int step) const {
  if (step < warmup_steps) return max_lr * static_cast<float>(step + 1) / warmup_steps;
  if (step >= total_steps) return min_lr;
  const double progress =
      static_cast<double>(step - warmup_steps) / std::max(1, total_steps - warmup_steps);
  const double coefficient = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(min_lr + coefficient * (max_lr - min_lr));
}

}  // namespace layup
