// The phases of `layup train` before its first step, in the order train() calls them: where the
// run resumes, its ranks, its outputs, its data and the start of its training state.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/token_dataset.h"
#include "engine/run_composer.h"
#include "io/checkpoint.h"
#include "tokenizer/tokenizer.h"
#include "train/corpus_shards.h"
#include "train/prepared_run.h"
#include "train/train_options.h"

namespace layup {

// Paths given relative to the working folder made absolute (checkpoints save them: a resume from
// another folder finds them); a --init-from folder with a tokenizer.json lends it to the run.
void make_paths_absolute(TrainOptions& options);

// Where a resumed run picks up; a fresh run's is empty (step 0, no checkpoint).
struct ResumePoint {
  CheckpointInfo checkpoint;
  std::string from;                // the checkpoint's folder; empty: a fresh run
  std::vector<std::string> notes;  // what resuming changed that the run should say
  bool continues_this_folder = false;
  int step = 0;
};

// With --resume: reads the checkpoint's model and settings into `options` (the command line may
// change only what leaves the trajectory alone: resume_settings) and refuses a finished run.
ResumePoint find_resume_point(TrainOptions& options);

// Without --save-dtype, a fresh run from --init-from saves its weights in the dtype they came in
// (hf_weights_dtype); a resumed run keeps its own (resume_settings), a fresh model fp32.
void choose_save_dtype(TrainOptions& options);

// What the run's checkpoints carry to be handed on as Hugging Face folders (HfFolderExtras), read
// now from where the run started: the special token ids of --init-from's config.json (or the
// resumed checkpoint's), the tokenizer's files (--tokenizer's, else --init-from's; a resumed
// checkpoint's own where it has them) and the source's generation_config.json.
HfFolderExtras read_checkpoint_extras(const TrainOptions& options, const ResumePoint& resume);

// The ranks mpirun started (one without it) and what this rank does: rank 0 alone writes the run
// folder, the log and checkpoints and prints; the others train in step with it.
struct RunRanks {
  std::unique_ptr<Communicator> world;
  int rank = 0, count = 1;
  bool leader = true;
  bool take_part_in_checkpoints = false;  // every rank does; rank 0 alone writes them
  FILE* out = stderr;                     // what this rank prints goes here (/dev/null but on 0)
  std::unique_ptr<FILE, int (*)(FILE*)> silent{nullptr, &std::fclose};
};

// Joins the ranks, checks they were given the same settings before any collective, and drops
// from `options` what rank 0 alone does on the others.
RunRanks join_ranks(TrainOptions& options, const ResumePoint& resume);

// Picks the run folder (a fresh timestamped one without --out) and checks it and the trace file
// can be written, before anything is loaded.
void check_run_outputs(TrainOptions& options, const ResumePoint& resume, const RunRanks& ranks);

// The run's tokens: found before the plan (their size is part of it), read once it fits.
struct TrainingData {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string tokenizer_dir;
  DataFolderShards shards;
  std::unique_ptr<TokenDataset> train, val;
  std::unique_ptr<BatchSampler> sampler;
  std::unique_ptr<ValidationBatches> validation;
};

// Loads the tokenizer and finds the shards (the shipped corpus, tokenized once, without --data),
// which every rank must agree on.
TrainingData find_training_data(const TrainOptions& options, const RunRanks& ranks);

// Reads the shards found into the train and validation streams, checking their ids against the
// model's vocabulary.
void read_training_data(TrainingData& data, const TrainOptions& options);

// The checkpoints' disk need against the run folder's free space; with a plan whose disk tier
// shares that file system, against what the tier leaves. Nothing is checked without checkpoints.
void check_checkpoints_fit(const TrainOptions& options, int start_step,
                           const MemoryPlan* plan = nullptr);

// What plan_run takes for this run.
RunRequest train_run_request(const TrainOptions& options, const TrainingData& data,
                             const ResumePoint& resume, const RunRanks& ranks);

// The training state the run starts from (a checkpoint's, --init-from's weights, or fresh),
// loaded into the schedule; the tokens seen so far.
long long load_training_state(const TrainOptions& options, const ResumePoint& resume,
                              PreparedRun& run, BatchSampler& sampler);

// Stops here, before anything is written, when a signal came during the set-up.
void refuse_if_stopped(const ResumePoint& resume);

// Makes the run folder (rank 0), replacing another run's files with --overwrite: only once
// everything it depends on has loaded, so a command that fails on bad input leaves nothing.
void create_run_folder(const TrainOptions& options, const ResumePoint& resume,
                       const RunRanks& ranks);

}  // namespace layup
