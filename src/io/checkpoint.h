// Checkpoints of a training run: `<run_dir>/step-00000100/` holding model.safetensors and
// config.json (a Hugging Face GPT-2 directory, see hf_checkpoint.h) and training_state.safetensors.
// Loading also reads the sharded forms of both (model-*-of-*.safetensors with its index,
// optimizer-*-of-*.safetensors with its index) wherever they appear instead.
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

// "step-00000100" for step 100.
std::string checkpoint_dir_name(int64_t step);

// Writes a checkpoint of `state.step` into `run_dir` (created if needed) and returns its path.
// An existing checkpoint of the same step is replaced atomically. Afterwards the `keep_last` most
// recent checkpoints up to this one are kept and older ones deleted; 0 keeps all. Checkpoints of
// later steps (left by an earlier, longer run) are not touched.
std::string save_checkpoint(const std::string& run_dir, const Gpt2Config& config,
                            const ParameterLayout& layout, const float* params,
                            const TrainingState& state, int keep_last = 2);

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

// Loads find_latest_checkpoint(dir): the model always, the training state when it exists (one
// file or sharded; both at once is refused as ambiguous).
// A state whose step differs from the step in its folder's name (step-00000005 holding step 7) is
// refused, naming both.
Checkpoint load_checkpoint(const std::string& dir);

}  // namespace layup
