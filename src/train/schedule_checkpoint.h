// A run's checkpoints written from its schedule and read back into it span by span, and the disk
// they need (docs/running.md, "Checkpoints"): the host holds one span's state at a time, never the
// model's, so a checkpoint of a model larger than host memory is written and resumed alike.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "core/run_choices.h"
#include "io/checkpoint.h"
#include "schedule/schedule.h"
#include "tier/disk_space.h"

namespace layup {

// Writes a checkpoint of `progress.step` into `run_dir` from the schedule's state, exported one
// span at a time (Schedule::export_span): the weights always, the training state with `contents`
// full. Memory held: one span's parameters and moments, and the writers' scratch.
SavedCheckpoint save_schedule_checkpoint(const std::string& run_dir, const Schedule& schedule,
                                         const TrainingProgress& progress,
                                         CheckpointContents contents,
                                         const CheckpointWriteOptions& options);

// Refuses a checkpoint whose config.json describes another model than its weights hold or its
// training state was saved from (a file edited, or copied from another checkpoint), naming the
// field or tensor, both values and the files: what a resume checks before it plans anything.
void check_resumable_shape(const CheckpointInfo& info);

// Loads the checkpoint `info` describes (it must have a training state) into the schedule, one
// span at a time, whatever placement the schedule has (Schedule::import_span). Its model must be
// the schedule's. Memory held: one span's parameters and moments, and the readers' scratch.
void load_schedule_checkpoint(const CheckpointInfo& info, Schedule& schedule);

// Starts `schedule` from the weights of the Hugging Face model folder `hf_dir` (whose config.json
// must describe the schedule's model), span by span, with zero moments: `layup train
// --init-from`. Memory held as load_schedule_checkpoint's.
void load_schedule_weights(const std::string& hf_dir, Schedule& schedule);

// The disk the rest of a run's checkpoints take at once: a new one is written before the oldest
// beyond --keep-checkpoints is deleted.
struct CheckpointDiskNeed {
  CheckpointBytes each;
  CheckpointContents contents = CheckpointContents::kFull;
  int keep_last = 1;
  int checkpoints = 0;  // how many more the file system holds at the peak
  size_t bytes() const { return checkpoints * each.total(); }
};

// The need of a run that writes `saves` more checkpoints into a folder holding `existing` ones,
// with weights of `dtype` and moments of `kind`.
CheckpointDiskNeed checkpoint_disk_need(const ParameterLayout& layout, CheckpointContents contents,
                                        size_t max_shard_bytes, int saves, int keep_last,
                                        int existing, WeightsDtype dtype = WeightsDtype::kFp32,
                                        OptimizerStateKind kind = OptimizerStateKind::kFp32);

// Throws layup::Error when `space` has not `need.bytes()` free, naming both and the flags that
// would need less.
void check_checkpoint_disk(const CheckpointDiskNeed& need, const DiskSpace& space);

// Throws layup::Error when a file size limit of `limit_bytes` (ulimit -f) would cut a checkpoint's
// largest file short, naming the file, both sizes and the flags that would write smaller files.
void check_checkpoint_file_size_limit(const ParameterLayout& layout, CheckpointContents contents,
                                      size_t max_shard_bytes, std::optional<size_t> limit_bytes);

// The run folder `dir`, or its nearest ancestor that exists: where a folder not made yet will be.
std::string existing_folder_of(const std::string& dir);

}  // namespace layup
