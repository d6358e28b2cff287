// The training loop of `layup train`: data, schedule, evaluation, logging, checkpoints, sample.
#pragma once

#include <string>
#include <vector>

#include "energy/energy_meter.h"
#include "train/train_options.h"

namespace layup {

struct TrainResult {
  int steps_done = 0;
  float initial_val_loss = 0.0f;  // NaN when no evaluation ran
  float final_val_loss = 0.0f;
  std::string last_checkpoint;  // empty when none was written
  std::string sample;           // the generated text at the end, if any
  std::string stopped_by;       // the signal that stopped the run early ("SIGTERM"), or empty
  double wall_s = 0.0;
  // With options.energy: per source, over the steps this run did (evaluations and checkpoints
  // between them included), and how many steps that was.
  std::vector<EnergyReading> energy;
  int energy_steps = 0;
  // Under mpirun: whether this is rank 0, the one that reports (docs/parallel.md).
  bool reports = true;
};

// Runs (or resumes) training as the options say. Throws layup::Error for bad input and when
// the loss stops being finite (no checkpoint is written after that point; the message names
// the last good one).
TrainResult train(TrainOptions options);

}  // namespace layup
