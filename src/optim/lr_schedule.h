// Learning rate over training: linear warmup, then cosine decay to a floor.
#pragma once

namespace layup {

struct LrSchedule {
  float max_lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup_steps = 0;
  int total_steps = 1;

  // The learning rate of update `step` (0-based): max_lr * (step + 1) / warmup during warmup,
  // then min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2 with progress going from 0 at
  // the end of warmup to 1 at total_steps.
  float at(int step) const;
};

}  // namespace layup
