// The steps of `layup train` once its schedule holds its starting state: the header, each update
// (draw the micro-batches, step, log, evaluate, checkpoint, stop on a signal), the reports at the
// end and the sample.
#pragma once

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "train/progress_line.h"
#include "train/train_setup.h"
#include "train/trainer.h"

namespace layup {

// One JSON object per line, flushed as written, so a crashed run still leaves its log. A line
// that cannot be written (a full disk, the file size limit) stops the run: a log with holes would
// mislead.
class JsonLinesLog {
 public:
  explicit JsonLinesLog(const std::string& path);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
  uintmax_t whole_bytes_ = 0;  // the file's length up to its last whole line
  bool regular_ = false;
};

class TrainingLoop {
 public:
  // Opens the run's log (rank 0; in the run folder, which exists by now) and its progress line.
  // Each checkpoint carries `checkpoint_extras` (read_checkpoint_extras).
  TrainingLoop(const TrainOptions& options, const ResumePoint& resume, const RunRanks& ranks,
               PreparedRun& run, TrainingData& data, long long tokens_seen,
               const HfFolderExtras& checkpoint_extras);

  // What the run is: the model, batch, schedule, folder and memory plan, and where it resumed.
  void print_header();
  // From the resume point (or step 0, evaluated first) to the last step, --until-step or a
  // signal. Throws layup::Error when the loss stops being finite.
  TrainResult run();
  // The reports of the end (CPU AdamW, trace, memory measured beside planned) and, after a whole
  // run, the sample.
  void finish(TrainResult& result);

 private:
  float evaluate(int step);
  void save_checkpoint(int step, TrainResult& result);
  // This rank's micro-batches of the next step.
  void draw_micro_batches();

  const TrainOptions& options_;
  const ResumePoint& resume_;
  const RunRanks& ranks_;
  PreparedRun& run_;
  TrainingData& data_;
  const HfFolderExtras& checkpoint_extras_;
  long long tokens_seen_;
  const int last_step_;
  const long long tokens_per_step_;
  JsonLinesLog log_;
  ProgressLine progress_;
  std::string intact_checkpoint_;  // the newest complete checkpoint, which a failed save keeps
  std::vector<TokenBatchBuffer> buffers_;
  std::vector<TokenBatch> micro_batches_;
  TokenBatchBuffer other_ranks_batch_;
};

}  // namespace layup
