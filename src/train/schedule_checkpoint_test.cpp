// Tests of checkpoints streamed span by span out of a schedule and back into one of another
// placement (sharded and single-file, weights only, older single-file checkpoints), and of the
// disk a run's checkpoints need.
#include "train/schedule_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/test_files.h"
#include "schedule/random_step.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::error_message;
using test_files::TempDir;

constexpr int kBatch = 2, kSeqLen = 8;

ModelConfig tiny_config() {
  return gpt2_config(3, 2, 16, 16, 50);
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_state(const Schedule& a, const Schedule& b) {
  const OptimizerTensors x = a.export_tensors(), y = b.export_tensors();
  EXPECT_TRUE(same_floats(x.params, y.params));
  EXPECT_TRUE(same_floats(x.adam_m, y.adam_m));
  EXPECT_TRUE(same_floats(x.adam_v, y.adam_v));
}

std::unique_ptr<Schedule> layup_schedule(const ParameterLayout& layout,
                                         std::vector<UpdateSite> sites = {}) {
  ScheduleOptions options;
  options.cpu_workers = 1;
  options.update_sites = std::move(sites);
  return make_schedule(Mode::kLayup, make_cpu_backend(layout.config(), kBatch, kSeqLen),
                       make_cpu_device(), layout, options);
}

// A layup schedule one step into training, so that its moments are not zero.
std::unique_ptr<Schedule> trained_schedule(const ParameterLayout& layout) {
  std::unique_ptr<Schedule> schedule = layup_schedule(layout);
  schedule->initialize_fresh(11);
  EXPECT_TRUE(random_step(*schedule, layout.config(), kBatch, kSeqLen, 1, 1.0f).applied);
  return schedule;
}

TrainingProgress progress_at(int64_t step) {
  TrainingProgress progress;
  progress.step = step;
  progress.data_rng_state = 99;
  progress.tokens_seen = 1234;
  return progress;
}

bool exists(const std::string& dir, const std::string& name) {
  return fs::exists(fs::path(dir) / name);
}

TEST(ScheduleCheckpoint, ResumesIntoAnotherPlacementBitForBitSingleOrSharded) {
  const ParameterLayout layout(tiny_config());
  std::unique_ptr<Schedule> source = trained_schedule(layout);
  std::vector<UpdateSite> all_on_device(layout.spans().size(), UpdateSite::kDevice);
  // 2 KB shards: every file splits; 64-byte chunks: the writers' reads cross spans.
  for (size_t shard_bytes : {size_t{2000}, kDefaultCheckpointShardBytes}) {
    SCOPED_TRACE(shard_bytes);
    TempDir dir;
    const SavedCheckpoint saved = save_schedule_checkpoint(
        dir.path(), *source, progress_at(3), CheckpointContents::kFull, {shard_bytes, 64, 2, {}});
    EXPECT_EQ(saved.path, dir.file("step-00000003"));
    EXPECT_GT(saved.bytes, 11 * layout.total_count());  // all but the padded vocabulary rows
    EXPECT_LT(saved.bytes, 12 * layout.total_count() + (size_t{1} << 20));
    const bool sharded = shard_bytes < kDefaultCheckpointShardBytes;
    EXPECT_EQ(exists(saved.path, "model.safetensors.index.json"), sharded);
    EXPECT_EQ(exists(saved.path, "optimizer.safetensors.index.json"), sharded);
    EXPECT_EQ(exists(saved.path, "model.safetensors"), !sharded);
    EXPECT_EQ(exists(saved.path, "training_state.safetensors"), !sharded);
    EXPECT_EQ(exists(saved.path, "optimizer-00002-of-00003.safetensors"), false);

    const CheckpointInfo info = read_checkpoint_info(dir.path());
    ASSERT_TRUE(info.has_training_state);
    EXPECT_EQ(info.progress.step, 3);
    EXPECT_EQ(info.progress.data_rng_state, 99u);
    EXPECT_EQ(info.progress.tokens_seen, 1234);

    // Into layup with every span's state on the device side, and into the gpu mode.
    std::unique_ptr<Schedule> on_device = layup_schedule(layout, all_on_device);
    std::unique_ptr<Schedule> gpu = make_schedule(
        Mode::kGpu, make_cpu_backend(layout.config(), kBatch, kSeqLen), make_cpu_device(), layout);
    for (Schedule* target : {on_device.get(), gpu.get()}) {
      load_schedule_checkpoint(info, *target);
      expect_same_state(*source, *target);
    }
    // The whole-model reader sees the same checkpoint.
    const Checkpoint whole = load_checkpoint(dir.path());
    const OptimizerTensors state = source->export_tensors();
    EXPECT_TRUE(same_floats(whole.model.params, state.params));
    EXPECT_TRUE(same_floats(whole.state.adam_v, state.adam_v));

    // The next step is the same step.
    std::unique_ptr<Schedule> continued = layup_schedule(layout);
    load_schedule_checkpoint(info, *continued);
    std::unique_ptr<Schedule> straight = layup_schedule(layout);
    straight->import_tensors(state);
    const StepStats a = random_step(*straight, layout.config(), kBatch, kSeqLen, 1, 1.0f);
    const StepStats b = random_step(*continued, layout.config(), kBatch, kSeqLen, 1, 1.0f);
    const StepStats c = random_step(*on_device, layout.config(), kBatch, kSeqLen, 1, 1.0f);
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(&a.loss, &c.loss, sizeof(float)), 0);
    expect_same_state(*straight, *continued);
    expect_same_state(*straight, *on_device);
  }
}

TEST(ScheduleCheckpoint, AnOlderSingleFileCheckpointLoadsSpanBySpan) {
  const ParameterLayout layout(tiny_config());
  std::unique_ptr<Schedule> source = trained_schedule(layout);
  TempDir dir;
  OptimizerTensors tensors = source->export_tensors();
  TrainingState state;
  static_cast<TrainingProgress&>(state) = progress_at(5);
  state.adam_m = tensors.adam_m;
  state.adam_v = tensors.adam_v;
  save_checkpoint(dir.path(), layout.config(), layout, tensors.params.data(), state);
  std::unique_ptr<Schedule> target = layup_schedule(layout);
  load_schedule_checkpoint(read_checkpoint_info(dir.path()), *target);
  expect_same_state(*source, *target);
}

TEST(ScheduleCheckpoint, WeightsOnlyHoldsTheWeightsAndIsNotResumable) {
  const ParameterLayout layout(tiny_config());
  std::unique_ptr<Schedule> source = trained_schedule(layout);
  TempDir dir;
  const SavedCheckpoint saved = save_schedule_checkpoint(
      dir.path(), *source, progress_at(2), CheckpointContents::kWeights, {2000, 64, 2, {}});
  EXPECT_TRUE(exists(saved.path, "model.safetensors.index.json"));
  EXPECT_TRUE(exists(saved.path, "config.json"));
  EXPECT_FALSE(exists(saved.path, "optimizer.safetensors.index.json"));
  EXPECT_FALSE(exists(saved.path, "training_state.safetensors"));
  EXPECT_LT(saved.bytes, 8 * layout.total_count());
  const Checkpoint loaded = load_checkpoint(dir.path());
  EXPECT_FALSE(loaded.has_training_state);
  EXPECT_TRUE(same_floats(loaded.model.params, source->export_tensors().params));
  std::unique_ptr<Schedule> target = layup_schedule(layout);
  EXPECT_NE(error_message([&] {
              load_schedule_checkpoint(read_checkpoint_info(dir.path()), *target);
            }).find("weights only"),
            std::string::npos);
}

// `--init-from` into a run of a compact state kind imports its coded zero moments as they are
// (the run's kind, one span of them), and trains exactly as the fp32 zeros coded on the way in
// did, with placements on the host and on disk.
TEST(ScheduleCheckpoint, HuggingFaceWeightsStartACompactKindFromItsZeroMoments) {
  const ParameterLayout layout(tiny_config());
  std::unique_ptr<Schedule> source = trained_schedule(layout);
  TempDir dir, offload;
  const SavedCheckpoint saved = save_schedule_checkpoint(
      dir.path(), *source, progress_at(2), CheckpointContents::kWeights, {2000, 64, 2, {}});
  const std::vector<float> weights = source->export_tensors().params;
  std::vector<UpdateSite> on_disk(layout.spans().size(), UpdateSite::kHost);
  on_disk[2] = UpdateSite::kDisk;
  for (const std::vector<UpdateSite>& sites : {std::vector<UpdateSite>{}, on_disk}) {
    const auto compact = [&] {
      ScheduleOptions options;
      options.cpu_workers = 1;
      options.update_sites = sites;
      options.offload_dir = offload.path();
      options.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
      return make_schedule(Mode::kLayup, make_cpu_backend(layout.config(), kBatch, kSeqLen),
                           make_cpu_device(), layout, options);
    };
    std::unique_ptr<Schedule> loaded = compact(), coded_on_the_way = compact();
    load_schedule_weights(saved.path, *loaded);
    std::vector<float> zeros;
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      const Span& span = layout.spans()[index];
      zeros.assign(span.count, 0.0f);
      coded_on_the_way->import_span(index,
                                    {weights.data() + span.offset, zeros.data(), zeros.data()});
    }
    for (Schedule* schedule : {loaded.get(), coded_on_the_way.get()})
      ASSERT_TRUE(random_step(*schedule, layout.config(), kBatch, kSeqLen, 1, 1.0f).applied);
    expect_same_state(*loaded, *coded_on_the_way);
  }
}

// A checkpoint whose files disagree on the model (config.json edited, or copied from another
// checkpoint) is a user's error, named by field and file before anything is planned.
TEST(ScheduleCheckpoint, AConfigOfAnotherShapeIsRefusedNamingTheField) {
  const ParameterLayout layout(tiny_config());
  std::unique_ptr<Schedule> source = trained_schedule(layout);
  TempDir dir;
  TrainingProgress progress = progress_at(4);
  progress.options = {{"n_layer", 3}, {"n_head", 2}, {"n_embd", 16}, {"batch", 2}};
  save_schedule_checkpoint(dir.path(), *source, progress, CheckpointContents::kFull,
                           {kDefaultCheckpointShardBytes, 64, 2, {}});
  CheckpointInfo info = read_checkpoint_info(dir.path());
  EXPECT_NO_THROW(check_resumable_shape(info));

  info.config.n_layer = 2;  // as a config.json saying n_layer 2 reads
  std::string message = error_message([&] { check_resumable_shape(info); });
  EXPECT_NE(message.find("cannot resume " + info.path +
                         ": its config.json describes a model "
                         "with n_layer 2, but its training state (" +
                         info.training_state_path + ") was saved by a run with n_layer 3"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("Put back the config.json saved with this checkpoint"), std::string::npos);

  // A field the settings do not keep shows in the weights' shapes.
  info = read_checkpoint_info(dir.path());
  info.config.n_positions = 32;
  message = error_message([&] { check_resumable_shape(info); });
  EXPECT_NE(message.find("tensor 'transformer.wpe.weight' has shape [16, 16]"), std::string::npos)
      << message;

  // Into a schedule built for another model: the field, not an internal error.
  const ParameterLayout other(gpt2_config(2, 2, 16, 16, 50));
  std::unique_ptr<Schedule> target = layup_schedule(other);
  message =
      error_message([&] { load_schedule_checkpoint(read_checkpoint_info(dir.path()), *target); });
  EXPECT_NE(message.find("describes a model with n_layer 3, but the run was built with 2"),
            std::string::npos)
      << message;
}

TEST(ScheduleCheckpoint, DiskNeedCountsTheCheckpointsAliveAtOnce) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  const size_t n = layout.total_count();
  const size_t padded_rows = size_t(config.padded_vocab_size - config.vocab_size) * config.n_embd;
  const CheckpointDiskNeed full = checkpoint_disk_need(layout, CheckpointContents::kFull,
                                                       kDefaultCheckpointShardBytes, 3, 2, 0);
  EXPECT_GE(full.each.weights, 4 * (n - padded_rows));  // the padded rows are not written
  EXPECT_GE(full.each.training_state, 8 * n);
  EXPECT_LT(full.each.total(), 12 * n + (size_t{8} << 20));
  // Fresh, three saves kept two at a time: the third is written beside the first two.
  EXPECT_EQ(full.checkpoints, 3);
  EXPECT_EQ(full.bytes(), 3 * full.each.total());
  const auto count = [&](int saves, int keep, int existing) {
    return checkpoint_disk_need(layout, CheckpointContents::kFull, kDefaultCheckpointShardBytes,
                                saves, keep, existing)
        .checkpoints;
  };
  EXPECT_EQ(count(1, 2, 0), 1);
  EXPECT_EQ(count(10, 1, 0), 2);
  EXPECT_EQ(count(10, 2, 2), 1);  // a resumed folder: its two are deleted as new ones arrive
  EXPECT_EQ(count(10, 2, 5), 1);
  EXPECT_EQ(count(0, 2, 0), 0);
  const CheckpointDiskNeed weights = checkpoint_disk_need(layout, CheckpointContents::kWeights,
                                                          kDefaultCheckpointShardBytes, 1, 2, 0);
  EXPECT_EQ(weights.each.training_state, 0u);
  EXPECT_EQ(weights.each.weights, full.each.weights);
}

TEST(ScheduleCheckpoint, ARunWhoseCheckpointsDoNotFitTheDiskIsRefusedSayingWhy) {
  const ParameterLayout layout(gpt2_config(48, 25, 1600, 1024, 50257));  // gpt2-xl
  const CheckpointDiskNeed need = checkpoint_disk_need(layout, CheckpointContents::kFull,
                                                       kDefaultCheckpointShardBytes, 5, 2, 0);
  const size_t tb = size_t{1} << 40;
  EXPECT_NO_THROW(check_checkpoint_disk(need, disk_space("/big", tb, tb)));
  const std::string message = error_message(
      [&] { check_checkpoint_disk(need, disk_space("/data", tb, size_t{30} << 30)); });
  // Named: a temporary's c_str() in the list would not outlive the list's creation.
  const std::string bytes = format_bytes(need.bytes());
  for (const char* part : {"/data has 30.00 GiB free", "optimizer state", "--keep-checkpoints 2",
                           "3 more at once", "--checkpoint-contents weights", "--no-checkpoints",
                           "--out", "--keep-checkpoints 1", bytes.c_str()})
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
}

TEST(ScheduleCheckpoint, TheFolderToAskAboutIsTheNearestThatExists) {
  TempDir dir;
  EXPECT_EQ(existing_folder_of(dir.file("runs/new/deeper")), dir.path());
  EXPECT_EQ(existing_folder_of(dir.path()), dir.path());
}

}  // namespace
}  // namespace layup
