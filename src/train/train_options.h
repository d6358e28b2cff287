// Everything `layup train` can be told, with the defaults of the embedded default run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/instruction_data.h"
#include "engine/run_spec.h"
#include "io/hf_checkpoint.h"

namespace layup {

struct TrainOptions : RunSpec {
  // Data: a folder of train_*.bin / val_*.bin token shards, or a .jsonl or text file tokenized
  // into a cache folder; empty = the shipped corpus, tokenized once into a cache folder.
  std::string data_dir;
  LearnTokens learn = LearnTokens::kCompletions;  // which tokens of a --data file are learned
  bool pack_examples = true;  // false: --no-packing (instruction data: one example per window)
  std::string tokenizer_dir;  // for the final sample and the default data; empty = shipped

  // Optimization.
  int steps = 300;
  int until_step = -1;  // stop after this update, to split a run into jobs (-1: run to `steps`)
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  int warmup_steps = 20;  // without --warmup: at most `steps` (clamp_default_warmup)
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;

  // Evaluation, logging, checkpoints.
  int eval_every = 50;
  int eval_batches = 8;
  int checkpoint_every = 100;
  int keep_checkpoints = 2;
  bool checkpoints = true;  // false: --no-checkpoints
  CheckpointContents checkpoint_contents = CheckpointContents::kFull;
  int checkpoint_shard_mb = 5000;  // files of at most this many MB (10^6 bytes) of tensors
  // The dtype of the checkpoints' model weights; without --save-dtype, --init-from's (fp32 for a
  // fresh model): choose_save_dtype.
  WeightsDtype save_dtype = WeightsDtype::kFp32;
  int log_every = 10;  // progress lines when stderr is not a terminal
  std::string out_dir;
  std::string resume;
  // A Hugging Face model folder (config.json, weights; tokenizer.json for the data and sample
  // unless --tokenizer says otherwise): the run starts from its weights, with fresh moments.
  std::string init_from;

  // The sample printed at the end.
  int sample_tokens = 64;
  std::string sample_prompt = "\n";
  float temperature = 0.8f;
  int top_k = 40;

  uint64_t seed = 1337;
  std::string trace_path;  // a Chrome/Perfetto trace of every step goes here; empty = none
  bool energy = false;     // read energy over the steps (energy/energy_meter.h)
  bool overwrite = false;  // a fresh run may replace another run's checkpoints and log in out_dir

  // The flags given on the command line ("--lr", ...): on --resume they override the run's own
  // settings (train/train_options.h, resume_settings), the rest come from the checkpoint.
  std::vector<std::string> given_flags;
};

// Throws layup::Error for contradictory or out-of-range options, naming the flag.
void validate_train_options(const TrainOptions& options);

// Cuts the default warmup to `steps` when --warmup is not among the given flags, so that a short
// run (--steps 2) needs no --warmup; a --warmup given above --steps is left for validation to
// refuse. Before resume_settings, which then puts back a resumed run's own warmup.
void clamp_default_warmup(TrainOptions& options);

// Throws layup::Error unless a sequence of seq_len tokens fits in the model's context.
void check_seq_len_fits(int seq_len, const ModelConfig& model);

// Every setting a checkpoint keeps so that `--resume DIR` alone continues the run as it was, as
// JSON: the model, the batch, the optimizer and the data (what the trajectory depends on), and
// how the run evaluates, checkpoints, samples and schedules its work.
nlohmann::json run_settings(const TrainOptions& options);

// The same settings in their table's order (the model's shape first), each with the flag that
// sets it ("" for the vocabulary, which the model fixes): what the ranks of a run compare.
struct NamedSetting {
  std::string key, flag;
  nlohmann::json value;
};
std::vector<NamedSetting> run_settings_in_order(const TrainOptions& options);

// `options` (the command line) on resuming a run whose checkpoint saved `saved` (run_settings):
// each setting the command line did not give is taken from the checkpoint; one it gave that
// changes the trajectory and differs is refused, naming both values; --steps may change (the
// learning-rate schedule's length then changes: `notes` says so). Settings an older checkpoint
// did not save keep the command line's values. `checkpoint` names the checkpoint in messages.
TrainOptions resume_settings(TrainOptions options, const nlohmann::json& saved,
                             const std::string& checkpoint, std::vector<std::string>& notes);

// A saved setting's value as its flag takes it: a string unquoted, a float stored from a float as
// the shortest text that reads back to it ("0.001", not the double's 0.0010000000474974513).
std::string setting_text(const nlohmann::json& value);

// The value of a --clip flag: a positive threshold, or "none" (0: no clipping). Throws
// layup::Error for anything else.
float parse_clip_flag(const std::string& text);

}  // namespace layup
