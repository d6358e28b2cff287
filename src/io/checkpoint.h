// Checkpoints of a training run: `<run_dir>/step-00000100/` holding model.safetensors and
// config.json (a Hugging Face directory, see hf_checkpoint.h) and training_state.safetensors,
// or the sharded forms of both (model-*-of-*.safetensors with its index,
// optimizer-*-of-*.safetensors with its index) where they are larger than a shard. Weights saved
// in bf16 are not the run's fp32 master weights: a resumable checkpoint then holds those too, in
// master_weights.safetensors (or its shards), which a resume reads instead of the bf16 ones. The
// streamed save and load move the tensors a chunk at a time through callbacks, so a checkpoint
// never needs the model in memory.
//
// A checkpoint appears complete or not at all: it is written into `step-XXXXXXXX.partial/`, every
// file and the directory are flushed to disk, and only then is the directory renamed to its final
// name. A crash leaves at most a `.partial` directory, which readers ignore and the next save
// removes. Older checkpoints are deleted only after the new one is in place.
#pragma once

#include <cstdint>
#include <string>

#include "io/hf_checkpoint.h"
#include "io/training_state.h"

namespace layup {

inline constexpr const char* kMasterWeightsBaseName = "master_weights";

// "step-00000100" for step 100.
std::string checkpoint_dir_name(int64_t step);

// Writes a checkpoint of `state.step` into `run_dir` (created if needed) and returns its path.
// An existing checkpoint of the same step is replaced atomically. Afterwards the `keep_last` most
// recent checkpoints up to this one are kept and older ones deleted; 0 keeps all. Checkpoints of
// later steps (left by an earlier, longer run) are not touched.
std::string save_checkpoint(const std::string& run_dir, const ModelConfig& config,
                            const ParameterLayout& layout, const float* params,
                            const TrainingState& state, int keep_last = 2);

inline constexpr size_t kDefaultCheckpointShardBytes = size_t{5000} * 1000 * 1000;  // HF's "5GB"

// What a streamed save writes, read through callbacks in increasing offsets a chunk at a time.
struct StreamedCheckpoint {
  TrainingProgress progress;  // progress.step names the directory
  ReadParams read_params;
  // Unset: the checkpoint holds the weights only, loadable by transformers or `layup sample`
  // but not resumable.
  ReadMoments read_moments;
};

struct CheckpointWriteOptions {
  size_t max_shard_bytes = kDefaultCheckpointShardBytes;
  size_t chunk_bytes = kDefaultStreamChunkBytes;
  int keep_last = 2;
  // The weights' dtype, the special token ids, the tokenizer's files: written inside the
  // `.partial` directory with the rest, so a checkpoint has them all or is not there.
  HfFolderExtras hf;
};

struct SavedCheckpoint {
  std::string path;
  size_t bytes = 0;  // of every file in it
};

// save_checkpoint from callbacks: the weights as save_hf_model_sharded writes them, the training
// state as save_training_state_streamed does, each one file where it fits `max_shard_bytes` and
// shards beyond. Atomic and rotated as save_checkpoint is. Memory held: the writers' chunk and one
// transposed matrix.
SavedCheckpoint save_checkpoint_streamed(const std::string& run_dir, const ModelConfig& config,
                                         const ParameterLayout& layout,
                                         const StreamedCheckpoint& checkpoint,
                                         const CheckpointWriteOptions& options);

// The disk space one checkpoint of `layout` takes, written with shards of `max_shard_bytes`: the
// tensors' bytes, plus an allowance for their files' headers and the JSON files.
struct CheckpointBytes {
  size_t weights = 0;
  size_t training_state = 0;  // 0 for weights only; bf16 weights' fp32 master copy counts here
  size_t total() const { return weights + training_state; }
};
// `kind`: how the training state keeps the moments (coded where not fp32).
CheckpointBytes checkpoint_bytes(const ParameterLayout& layout, bool weights_only,
                                 size_t max_shard_bytes, WeightsDtype dtype = WeightsDtype::kFp32,
                                 OptimizerStateKind kind = OptimizerStateKind::kFp32);

// The largest file one checkpoint of `layout` writes with shards of `max_shard_bytes` (its tensors'
// bytes and the header allowance checkpoint_bytes counts): what a file size limit must let through.
struct CheckpointFile {
  std::string name;  // "model.safetensors", "optimizer-00002-of-00004.safetensors"
  size_t bytes = 0;
  size_t largest_tensor_bytes = 0;  // of the whole checkpoint: no shard size goes below it
};
CheckpointFile largest_checkpoint_file(const ParameterLayout& layout, bool weights_only,
                                       size_t max_shard_bytes);

// The complete checkpoints in `run_dir` (0 when it does not exist).
int count_checkpoints(const std::string& run_dir);

// `dir` itself if it is a model directory (holds model.safetensors or its index), else the complete
// `step-*` directory of the highest step inside it. Throws layup::Error if there is none.
std::string find_latest_checkpoint(const std::string& dir);

struct Checkpoint {
  std::string path;  // the checkpoint directory that was read
  LoadedModel model;
  bool has_training_state = false;
  TrainingState state;  // meaningful only when has_training_state

  // The training state, or a layup::Error saying that this checkpoint cannot be resumed from
  // (e.g. a model downloaded from Hugging Face holds weights only).
  const TrainingState& training_state() const;
};

// What a checkpoint is, read before its tensors: what a resume plans its run with.
struct CheckpointInfo {
  std::string path;  // find_latest_checkpoint's answer
  ModelConfig config;
  bool has_training_state = false;
  TrainingProgress progress;        // meaningful only when has_training_state
  std::string training_state_path;  // the single file or the index
};

// find_latest_checkpoint(dir)'s config and training progress, validated as load_checkpoint
// validates them (a state both single and sharded is ambiguous; a step that differs from its
// folder's is refused).
CheckpointInfo read_checkpoint_info(const std::string& dir);

// The checkpoint's weights to `write_params` (load_hf_model_streamed; the fp32 master weights
// where bf16 ones were saved beside them), then, when it has a training state, its moments to
// `write_moments` (each parameter tensor's m, then its v), from a
// single file or shards alike. Memory held: the readers' chunk and one transposed matrix.
void load_checkpoint_streamed(const CheckpointInfo& info, const WriteParams& write_params,
                              const WriteMoments& write_moments,
                              size_t chunk_bytes = kDefaultStreamChunkBytes);

// Loads find_latest_checkpoint(dir): the model always, the training state when it exists (one
// file or sharded; both at once is refused as ambiguous).
// A state whose step differs from the step in its folder's name (step-00000005 holding step 7) is
// refused, naming both.
Checkpoint load_checkpoint(const std::string& dir);

}  // namespace layup
