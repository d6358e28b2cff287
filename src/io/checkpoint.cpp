// Checkpoint directories: write into `.partial`, flush, publish by rename, then rotate.
#include "io/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <functional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {
namespace fs = std::filesystem;
namespace {

constexpr const char* kStepPrefix = "step-";
constexpr const char* kPartialSuffix = ".partial";

// The step of a complete checkpoint directory's name ("step-<digits>"), or -1.
int64_t parse_step_dir_name(const std::string& name) {
  if (!name.starts_with(kStepPrefix)) return -1;
  const char* begin = name.data() + std::strlen(kStepPrefix);
  const char* end = name.data() + name.size();
  if (begin == end) return -1;
  int64_t step = -1;
  auto [stop, error] = std::from_chars(begin, end, step);
  return error == std::errc() && stop == end && step >= 0 ? step : -1;
}

bool is_model_dir(const fs::path& dir) {
  std::error_code error;
  return has_hf_weights(dir.string()) && fs::is_regular_file(dir / kHfConfigFileName, error);
}

// Complete checkpoints in `run_dir`, by step.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, error)) {
    const int64_t step = parse_step_dir_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory(error) && is_model_dir(entry.path())) {
      found.emplace_back(step, entry.path());
    }
  }
  LAYUP_CHECK(!error, "cannot list the directory ", run_dir.string(), ": ", error.message());
  std::sort(found.begin(), found.end());
  return found;
}

void remove_tree(const fs::path& path) {
  std::error_code error;
  fs::remove_all(path, error);
  LAYUP_CHECK(!error, "cannot remove ", path.string(), ": ", error.message());
}

// Moves the finished `partial` directory to `final_dir`, replacing an existing one. rename()
// cannot replace a non-empty directory, so the two are swapped atomically (renameat2 with
// RENAME_EXCHANGE) and the old contents, now under the partial name, are deleted. Where the
// file system cannot swap, the old directory is moved aside first: a crash in between leaves it
// under a `.replaced` name, never a half-written checkpoint under the final one.
void publish_directory(const fs::path& partial, const fs::path& final_dir) {
  std::error_code error;
  if (!fs::exists(final_dir, error)) {
    if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
      fail("cannot rename ", partial.string(), " to ", final_dir.string(), ": ",
           std::strerror(errno));
    }
    return;
  }
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(partial, error);  // the old checkpoint; a leftover is removed on the next save
    return;
  }
  const fs::path replaced = final_dir.string() + ".replaced";
  fs::remove_all(replaced, error);
  if (::rename(final_dir.c_str(), replaced.c_str()) != 0) {
    fail("cannot move ", final_dir.string(), " aside to replace it: ", std::strerror(errno));
  }
  if (::rename(partial.c_str(), final_dir.c_str()) != 0) {
    const int rename_error = errno;
    ::rename(replaced.c_str(), final_dir.c_str());  // put the old checkpoint back
    fail("cannot rename ", partial.string(), " to ", final_dir.string(), ": ",
         std::strerror(rename_error));
  }
  fs::remove_all(replaced, error);
}

// Deletes leftovers of interrupted saves and the checkpoints before `step` beyond `keep_last`.
void rotate_checkpoints(const fs::path& run_dir, int64_t step, int keep_last) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(kStepPrefix) &&
        (name.ends_with(kPartialSuffix) || name.ends_with(".replaced") ||
         name.ends_with(".deleting"))) {
      remove_tree(entry.path());
    }
  }
  if (keep_last == 0) return;
  std::vector<std::pair<int64_t, fs::path>> older;
  for (auto& checkpoint : list_checkpoints(run_dir)) {
    if (checkpoint.first < step) older.push_back(std::move(checkpoint));
  }
  const size_t keep_older = static_cast<size_t>(keep_last - 1);
  if (older.size() <= keep_older) return;
  for (size_t i = 0; i < older.size() - keep_older; ++i) {
    // Rename first, so a crash mid-deletion leaves no half-deleted directory with a valid name.
    const fs::path doomed = older[i].second.string() + ".deleting";
    fs::rename(older[i].second, doomed, error);
    LAYUP_CHECK(!error, "cannot remove the old checkpoint ", older[i].second.string(), ": ",
                error.message());
    remove_tree(doomed);
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return name;
}

namespace {

// Writes one checkpoint of `step` through `write_files` (which fills the directory it is given),
// into `.partial`, flushed, published by rename, then rotated; returns the final directory.
std::string write_checkpoint_dir(const std::string& run_dir, int64_t step, int keep_last,
                                 const std::function<void(const std::string& dir)>& write_files) {
  LAYUP_CHECK(keep_last >= 0, "the number of checkpoints to keep must be 0 (all) or more, not ",
              keep_last);
  LAYUP_CHECK(step >= 0, "cannot save a checkpoint of negative step ", step);
  std::error_code error;
  fs::create_directories(run_dir, error);
  LAYUP_CHECK(!error, "cannot create the run directory ", run_dir, ": ", error.message());

  const fs::path final_dir = fs::path(run_dir) / checkpoint_dir_name(step);
  const fs::path partial = final_dir.string() + kPartialSuffix;
  remove_tree(partial);  // left by an interrupted save of the same step
  try {
    fs::create_directory(partial, error);
    LAYUP_CHECK(!error, "cannot create ", partial.string(), ": ", error.message());
    write_files(partial.string());
    fsync_directory(partial.string());
    publish_directory(partial, final_dir);
  } catch (...) {
    fs::remove_all(partial, error);
    throw;
  }
  fsync_directory(run_dir);
  rotate_checkpoints(run_dir, step, keep_last);
  return final_dir.string();
}

size_t directory_bytes(const fs::path& dir) {
  size_t bytes = 0;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error))
    if (entry.is_regular_file(error)) bytes += entry.file_size(error);
  return bytes;
}

// The step-vs-folder check of a loaded state: `state_path` names the file that says the step.
void check_step_matches_folder(const std::string& checkpoint_path, int64_t step,
                               const std::string& state_path) {
  // A folder not named step-N (e.g. one saved by Hugging Face) has no step to compare.
  const fs::path folder = fs::absolute(checkpoint_path).lexically_normal();
  const std::string folder_name =
      (folder.has_filename() ? folder : folder.parent_path()).filename().string();
  const int64_t folder_step = parse_step_dir_name(folder_name);
  LAYUP_CHECK(folder_step < 0 || folder_step == step, state_path, " says step ", step,
              " but its folder ", folder_name, " is named for step ", folder_step,
              "; the checkpoint's files were mixed up with another checkpoint's, or the folder "
              "was renamed. Resume from another checkpoint, or name the folder ",
              checkpoint_dir_name(step), " if its state is the right one");
}

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const ModelConfig& config,
                            const ParameterLayout& layout, const float* params,
                            const TrainingState& state, int keep_last) {
  return write_checkpoint_dir(run_dir, state.step, keep_last, [&](const std::string& dir) {
    save_hf_model(dir, config, layout, params);
    save_training_state((fs::path(dir) / kTrainingStateFileName).string(), layout, state);
  });
}

SavedCheckpoint save_checkpoint_streamed(const std::string& run_dir, const ModelConfig& config,
                                         const ParameterLayout& layout,
                                         const StreamedCheckpoint& checkpoint,
                                         const CheckpointWriteOptions& options) {
  SavedCheckpoint saved;
  saved.path = write_checkpoint_dir(
      run_dir, checkpoint.progress.step, options.keep_last, [&](const std::string& dir) {
        save_hf_model_sharded(dir, config, layout, checkpoint.read_params, options.max_shard_bytes,
                              options.chunk_bytes, options.hf);
        if (checkpoint.read_moments) {
          // A resume continues from the weights AdamW holds, not from their bf16 rounding.
          if (options.hf.dtype != WeightsDtype::kFp32)
            write_hf_weights(dir, kMasterWeightsBaseName, config, layout, checkpoint.read_params,
                             WeightsDtype::kFp32, options.max_shard_bytes, options.chunk_bytes);
          save_training_state_streamed(dir, layout, checkpoint.progress, checkpoint.read_moments,
                                       options.max_shard_bytes, options.chunk_bytes);
        }
        saved.bytes = directory_bytes(dir);
      });
  return saved;
}

CheckpointBytes checkpoint_bytes(const ParameterLayout& layout, bool weights_only,
                                 size_t max_shard_bytes, WeightsDtype dtype,
                                 OptimizerStateKind kind) {
  // A file's header (its tensors' names, shapes and offsets), an index or config.json: well under
  // this each.
  constexpr size_t kFileAllowance = size_t{1} << 20;
  const ModelConfig& config = layout.config();
  const size_t padded_rows =
      static_cast<size_t>(config.padded_vocab_size - config.vocab_size) * config.n_embd;
  const auto with_files = [&](size_t data_bytes) {
    const size_t files =
        2 + (data_bytes + max_shard_bytes - 1) / std::max<size_t>(1, max_shard_bytes);
    return data_bytes + files * kFileAllowance;
  };
  const size_t weight_count = layout.total_count() - padded_rows;
  const bool bf16 = dtype == WeightsDtype::kBf16;
  CheckpointBytes bytes;
  bytes.weights = with_files(weight_count * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  if (!weights_only) {
    bytes.training_state =
        with_files(kind == OptimizerStateKind::kFp32 ? 2 * layout.total_count() * sizeof(float)
                                                     : coded_moments_offsets(layout, kind).back());
    if (bf16) bytes.training_state += with_files(weight_count * sizeof(float));
  }
  return bytes;
}

CheckpointFile largest_checkpoint_file(const ParameterLayout& layout, bool weights_only,
                                       size_t max_shard_bytes) {
  constexpr size_t kFileAllowance = size_t{1} << 20;  // as checkpoint_bytes counts a header
  CheckpointFile largest;
  // Each part is planned as its writer plans it; a part of one shard is written under its single
  // file's name (save_hf_model_sharded, save_training_state_streamed).
  const auto consider = [&](const std::vector<SafetensorsTensorShape>& tensors,
                            const std::string& base_name, const char* single_name) {
    const std::vector<SafetensorsShard> shards = plan_shards(tensors, max_shard_bytes, base_name);
    for (const SafetensorsShard& shard : shards)
      if (shard.data_bytes + kFileAllowance > largest.bytes) {
        largest.bytes = shard.data_bytes + kFileAllowance;
        largest.name = shards.size() == 1 ? single_name : shard.file_name;
      }
    for (const SafetensorsTensorShape& tensor : tensors) {
      size_t count = 1;
      for (size_t dim : tensor.shape) count *= dim;
      largest.largest_tensor_bytes = std::max(largest.largest_tensor_bytes, count * sizeof(float));
    }
  };
  consider(hf_tensor_shapes(layout.config(), layout), kHfShardBaseName, kHfWeightsFileName);
  if (!weights_only)
    consider(moment_tensor_shapes(layout), kOptimizerShardBaseName, kTrainingStateFileName);
  return largest;
}

int count_checkpoints(const std::string& run_dir) {
  std::error_code error;
  if (!fs::is_directory(run_dir, error)) return 0;
  return static_cast<int>(list_checkpoints(run_dir).size());
}

std::string find_latest_checkpoint(const std::string& dir) {
  std::error_code error;
  LAYUP_CHECK(fs::exists(dir, error), "cannot load a checkpoint from ", dir, ": it does not exist");
  if (has_hf_weights(dir)) return dir;
  LAYUP_CHECK(fs::is_directory(dir, error), "cannot load a checkpoint from ", dir,
              ": it is not a directory");
  const auto checkpoints = list_checkpoints(dir);
  LAYUP_CHECK(!checkpoints.empty(), dir, " holds no checkpoint: expected ", kHfWeightsFileName,
              " (or ", shard_index_file_name(kHfShardBaseName), " and its shards) and ",
              kHfConfigFileName, " in it, or step-XXXXXXXX/ directories holding them (",
              kPartialSuffix, " directories are unfinished saves and are ignored)");
  return checkpoints.back().second.string();
}

const TrainingState& Checkpoint::training_state() const {
  LAYUP_CHECK(has_training_state, path, " holds model weights only (no ", kTrainingStateFileName,
              "), so a run cannot resume from it; start a new run initialized from these "
              "weights instead");
  return state;
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  CheckpointInfo info;
  info.path = find_latest_checkpoint(dir);
  info.config = read_hf_model_config(info.path);
  const fs::path single_state_path = fs::path(info.path) / kTrainingStateFileName;
  const bool sharded_state = has_sharded_training_state(info.path);
  std::error_code error;
  const bool single_state = fs::exists(single_state_path, error);
  if (!single_state && !sharded_state) return info;
  LAYUP_CHECK(!(single_state && sharded_state), info.path, " holds both ", kTrainingStateFileName,
              " and ", shard_index_file_name(kOptimizerShardBaseName),
              ", two saves of the training state; it is ambiguous which to resume from: remove "
              "the older one");
  info.has_training_state = true;
  info.training_state_path =
      sharded_state
          ? (fs::path(info.path) / shard_index_file_name(kOptimizerShardBaseName)).string()
          : single_state_path.string();
  info.progress = read_training_progress(info.training_state_path);
  check_step_matches_folder(info.path, info.progress.step, info.training_state_path);
  return info;
}

void load_checkpoint_streamed(const CheckpointInfo& info, const WriteParams& write_params,
                              const WriteMoments& write_moments, size_t chunk_bytes) {
  if (info.has_training_state && has_hf_weights_named(info.path, kMasterWeightsBaseName)) {
    // The model's config.json is checked as load_hf_model_streamed checks it.
    check_hf_weights(info.path, info.config);
    read_hf_weights(info.path, kMasterWeightsBaseName, info.config, write_params, chunk_bytes);
  } else {
    load_hf_model_streamed(info.path, info.config, write_params, chunk_bytes);
  }
  if (!info.has_training_state) return;
  const ParameterLayout layout(info.config);
  if (has_sharded_training_state(info.path))
    load_training_state_sharded(info.path, layout, write_moments, chunk_bytes);
  else
    load_training_state_streamed(info.training_state_path, layout, write_moments, chunk_bytes);
}

Checkpoint load_checkpoint(const std::string& dir) {
  const CheckpointInfo info = read_checkpoint_info(dir);
  Checkpoint checkpoint;
  checkpoint.path = info.path;
  checkpoint.model.config = info.config;
  checkpoint.has_training_state = info.has_training_state;
  static_cast<TrainingProgress&>(checkpoint.state) = info.progress;
  const ParameterLayout layout(info.config);
  checkpoint.model.params.assign(layout.total_count(), 0.0f);
  LAYUP_CHECK(
      !info.has_training_state || info.progress.optimizer_state == OptimizerStateKind::kFp32,
      info.path, " holds ", name_of(info.progress.optimizer_state),
      " optimizer state, which only a run resumes (layup train --resume)");
  if (info.has_training_state) {
    checkpoint.state.adam_m.resize(layout.total_count());
    checkpoint.state.adam_v.resize(layout.total_count());
  }
  TrainingState& state = checkpoint.state;
  float* params = checkpoint.model.params.data();
  load_checkpoint_streamed(
      info,
      [params](size_t offset, size_t count, const float* in) {
        std::memcpy(params + offset, in, count * sizeof(float));
      },
      [&state](AdamMoment moment, size_t offset, size_t count, const float* in) {
        float* moments = moment == AdamMoment::kFirst ? state.adam_m.data() : state.adam_v.data();
        std::memcpy(moments + offset, in, count * sizeof(float));
      });
  return checkpoint;
}

}  // namespace layup
