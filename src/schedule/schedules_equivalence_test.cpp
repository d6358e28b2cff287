// The three schedules compute the same training step: on the CPU backend in fp32, losses, norms
// and every parameter and AdamW moment after 10 steps agree bitwise, with gradient accumulation
// over micro-batches, with clipping that triggers on some steps, and with no clipping at all
// (where `layup` updates blocks during backward). gpu mode with bf16 or 8-bit moments is the fp32
// step from the decoded moments, its new moments coded.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "io/test_files.h"
#include "optim/adamw_moments.h"
#include "schedule/ranks_test_support.h"
#include "schedule/schedule.h"
#include "schedule/schedule_plan.h"

namespace layup {
namespace {

ModelConfig tiny_config() {
  return gpt2_config(3, 2, 32, 16, 61);
}

constexpr int kBatch = 2;
constexpr int kSeqLen = 8;
constexpr int kSteps = 10;

struct TrainingRun {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<float> clip_factors;
  std::vector<int> blocks_redone, blocks_deferred;  // per step (layup, speculative clipping)
  OptimizerTensors tensors;
};

// The clip threshold of each step (<= 0: none), given the step's micro-batches.
using ClipPlan = std::function<float(int step, std::span<const TokenBatch> batches)>;

using ScheduleFactory = std::function<std::unique_ptr<Schedule>(
    std::unique_ptr<ModelBackend>, std::unique_ptr<Device>, const ParameterLayout&)>;

// clip: true alternates a threshold that always clips with one that never does.
ClipPlan alternating_clip(bool clip) {
  return [clip](int step, std::span<const TokenBatch>) {
    return !clip ? 0.0f : (step % 2 == 0 ? 1e-3f : 1e6f);
  };
}

// The micro-batches of each step this process takes: `taken` from `first` (-1: all of them), as a
// rank of several takes its share.
struct Share {
  int first = 0;
  int taken = -1;
  // The ranks split the moments (ZeRO-1): rank 0 exports the state, asking the others for theirs.
  bool sharded = false;
};

// masked: about a quarter of the targets not learned (kNotLearned), a different count in each
// micro-batch, so each micro-batch's loss has a divisor of its own.
TrainingRun train(const ScheduleFactory& make, int micro_batches, const ClipPlan& clip_plan,
                  const ModelConfig& config = tiny_config(), Share share = {},
                  bool masked = false) {
  const ParameterLayout layout(config);
  std::unique_ptr<Schedule> schedule =
      make(make_cpu_backend(config, kBatch, kSeqLen), make_cpu_device(), layout);
  schedule->import_tensors(fresh_optimizer_tensors(layout, 7));

  std::mt19937 rng(2024);
  const size_t tokens = static_cast<size_t>(kBatch) * kSeqLen;
  std::vector<std::vector<int32_t>> inputs(micro_batches), targets(micro_batches);
  const int end = share.taken < 0 ? micro_batches : share.first + share.taken;
  TrainingRun run;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<TokenBatch> batches;
    for (int k = 0; k < micro_batches; ++k) {
      inputs[k].resize(tokens);
      targets[k].resize(tokens);
      for (size_t i = 0; i < tokens; ++i) {
        inputs[k][i] = static_cast<int32_t>(rng() % config.vocab_size);
        targets[k][i] = static_cast<int32_t>(rng() % config.vocab_size);
        if (masked && rng() % 4 == 0) targets[k][i] = kNotLearned;
      }
      if (k >= share.first && k < end)
        batches.push_back({inputs[k].data(), targets[k].data(), kBatch, kSeqLen});
    }
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-2f;
    settings.adamw.t = step + 1;
    settings.clip_max_norm = clip_plan(step, batches);
    const StepStats stats = schedule->step(batches, settings);
    EXPECT_TRUE(stats.applied);
    run.losses.push_back(stats.loss);
    run.norms.push_back(stats.grad_norm);
    run.clip_factors.push_back(stats.clip_factor);
    run.blocks_redone.push_back(stats.blocks_redone);
    run.blocks_deferred.push_back(stats.blocks_deferred);
  }
  if (share.sharded && share.first > 0) {
    schedule->serve_exports();
    return run;
  }
  run.tensors = schedule->export_tensors();
  schedule->end_exports();
  return run;
}

TrainingRun train(const ScheduleFactory& make, int micro_batches, bool clip,
                  const ModelConfig& config = tiny_config()) {
  return train(make, micro_batches, alternating_clip(clip), config);
}

// The schedule of `mode` with `options`.
ScheduleFactory with_options(const std::string& mode, const ScheduleOptions& options) {
  return [mode, options](std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                         const ParameterLayout& layout) {
    return make_schedule(parse_in(kModeNames, mode, "mode"), std::move(backend), std::move(device),
                         layout, options);
  };
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Parameters and both moments equal bit for bit; `what` names the comparison in a failure.
void expect_same_tensors(const OptimizerTensors& expected, const OptimizerTensors& actual,
                         const std::string& what) {
  EXPECT_TRUE(bitwise_equal(expected.params, actual.params)) << what << ": params";
  EXPECT_TRUE(bitwise_equal(expected.adam_m, actual.adam_m)) << what << ": m";
  EXPECT_TRUE(bitwise_equal(expected.adam_v, actual.adam_v)) << what << ": v";
}

void expect_same(const TrainingRun& expected, const TrainingRun& actual, const std::string& mode) {
  EXPECT_TRUE(bitwise_equal(expected.losses, actual.losses)) << mode << ": losses";
  EXPECT_TRUE(bitwise_equal(expected.norms, actual.norms)) << mode << ": gradient norms";
  EXPECT_TRUE(bitwise_equal(expected.clip_factors, actual.clip_factors)) << mode << ": clip";
  expect_same_tensors(expected.tensors, actual.tensors, mode);
}

// A schedule of `mode` on a fresh CPU backend of the tests' batch shape.
std::unique_ptr<Schedule> cpu_schedule(Mode mode, const ParameterLayout& layout,
                                       const ScheduleOptions& options = {},
                                       std::shared_ptr<MemoryAccountant> accountant = nullptr) {
  return make_schedule(mode, make_cpu_backend(layout.config(), kBatch, kSeqLen),
                       make_cpu_device(std::move(accountant)), layout, options);
}

// The resume tests' data and steps: step `step` trains on random tokens drawn from a seed of its
// own, so a run broken at any step and resumed sees the batches an unbroken run sees; every
// second step clips (at 1e-3, always), the others do not.
class ResumeSteps {
 public:
  ResumeSteps(const ModelConfig& config, unsigned seed)
      : vocab_size_(config.vocab_size),
        seed_(seed),
        inputs_(kBatch * kSeqLen),
        targets_(kBatch * kSeqLen) {}

  TokenBatch batch(int step) {
    std::mt19937 step_rng(seed_ + static_cast<unsigned>(step));
    for (size_t i = 0; i < inputs_.size(); ++i) {
      inputs_[i] = static_cast<int32_t>(step_rng() % vocab_size_);
      targets_[i] = static_cast<int32_t>(step_rng() % vocab_size_);
    }
    return TokenBatch{inputs_.data(), targets_.data(), kBatch, kSeqLen};
  }

  // Steps from .. to - 1.
  void run(Schedule& schedule, int from, int to) {
    for (int step = from; step < to; ++step) {
      const TokenBatch step_batch = batch(step);
      UpdateSettings settings;
      settings.adamw.hyper.lr = 1e-2f;
      settings.adamw.t = step + 1;
      settings.clip_max_norm = step % 2 == 0 ? 1e-3f : 0.0f;
      EXPECT_TRUE(schedule.step(std::span(&step_batch, 1), settings).applied) << "step " << step;
    }
  }

 private:
  int vocab_size_;
  unsigned seed_;
  std::vector<int32_t> inputs_, targets_;
};

void check_modes_agree(int micro_batches, bool clip, const ModelConfig& config = tiny_config()) {
  const TrainingRun gpu = train(with_options("gpu", {}), micro_batches, clip, config);
  const TrainingRun offload = train(with_options("offload", {}), micro_batches, clip, config);
  const TrainingRun layup = train(with_options("layup", {}), micro_batches, clip, config);
  // The run must actually train, and clip where asked to.
  EXPECT_NE(gpu.losses.front(), gpu.losses.back());
  int clipped = 0;
  for (float factor : gpu.clip_factors) clipped += factor < 1.0f;
  EXPECT_EQ(clipped, clip ? kSteps / 2 : 0);
  expect_same(gpu, offload, "offload");
  expect_same(gpu, layup, "layup");
}

TEST(SchedulesEquivalence, ClippedWithTwoMicroBatches) {
  check_modes_agree(2, true);
}
TEST(SchedulesEquivalence, UnclippedWithTwoMicroBatches) {
  check_modes_agree(2, false);
}
TEST(SchedulesEquivalence, ClippedWithOneMicroBatch) {
  check_modes_agree(1, true);
}
// A block of 1.2M floats: the later micro-batches' gradients of offload and layup cross to the
// host in three pieces through both slots of the staging buffer (schedule/host_gradient.cpp),
// the third reusing the first's slot.
TEST(SchedulesEquivalence, WideBlocksAccumulateThroughBothStagingSlots) {
  check_modes_agree(3, true, gpt2_config(1, 2, 320, 16, 61));
}

// The Llama family through the same three schedules: grouped-query attention, q/k/v and o_proj
// biases, an untied head in the final norm's span (llama_config's default), then a tied one.
TEST(SchedulesEquivalence, TheLlamaFamilyTrainsTheSameInEveryMode) {
  ModelConfig config = llama_config(3, 4, 2, 32, 48, 16, 61);
  config.attention_bias = config.attention_output_bias = true;
  check_modes_agree(2, true, config);
  config.tie_word_embeddings = true;
  config.attention_output_bias = false;
  check_modes_agree(1, false, config);
}

// What a unified-memory device runs (ScheduleOptions): offload and layup computing with the
// master weights in place, and layup with no whole-model host gradient, each block updated
// straight from its slot. The same steps, bit for bit.
TEST(SchedulesEquivalence, UnifiedMemoryLayoutsTrainTheSame) {
  const ScheduleOptions in_place{.weights_in_place = true};
  const ScheduleOptions slots_only{.weights_in_place = true, .host_gradient = false};
  for (const bool clip : {false, true}) {
    SCOPED_TRACE(clip ? "clipped" : "unclipped");
    const TrainingRun gpu = train(with_options("gpu", {}), 1, clip);
    expect_same(gpu, train(with_options("offload", in_place), 1, clip), "offload, in place");
    expect_same(gpu, train(with_options("layup", in_place), 1, clip), "layup, in place");
  }
  // Without a host gradient layup can neither clip nor accumulate; unclipped with one micro-batch
  // it trains like the others, with the weights in place or copied.
  const TrainingRun gpu = train(with_options("gpu", {}), 1, false);
  expect_same(gpu, train(with_options("layup", slots_only), 1, false), "layup, slots only");
  expect_same(gpu, train(with_options("layup", {.host_gradient = false}), 1, false),
              "layup, slots only, weights copied");
}

// Speculative clipping (ScheduleOptions::speculative_clip): layup updates every block during
// backward as if unclipped, into a spare state, unless the last step was clipped. Steps not
// clipped (speculating on the first, not after a clipped step) alternate with clipped ones that
// speculate: clipped just barely (threshold 0.999 of the step's norm: the blocks' own norm stays
// under it, so every block is updated during backward, then again with the clip factor) and
// clipped hard (threshold 1e-3: the first block consumed, the last one, already exceeds it, so
// no block is speculated on). Bitwise against the gpu mode, with one and two micro-batches, with
// the weights copied or in place.
TEST(SchedulesEquivalence, SpeculativeClippingTrainsLikeTheGpuMode) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  for (const int micro_batches : {1, 2}) {
    SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches");
    // The gpu run picks each barely-clipping threshold from its step's norm, found by taking the
    // step unclipped on a copy of the state (clipping a step does not change its own norm).
    std::vector<float> thresholds;
    Schedule* reference = nullptr;
    std::unique_ptr<Schedule> probe = cpu_schedule(Mode::kGpu, layout);
    const ScheduleFactory gpu_recording = [&](std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& gpu_layout) {
      std::unique_ptr<Schedule> schedule =
          make_schedule(Mode::kGpu, std::move(backend), std::move(device), gpu_layout);
      reference = schedule.get();
      return schedule;
    };
    const TrainingRun gpu =
        train(gpu_recording, micro_batches, [&](int step, std::span<const TokenBatch> batches) {
          float threshold = step % 4 == 3 ? 1e-3f : 1e6f;
          if (step % 4 == 1) {
            probe->import_tensors(reference->export_tensors());
            UpdateSettings unclipped;
            unclipped.adamw.t = 1;
            unclipped.clip_max_norm = 0.0f;
            threshold = static_cast<float>(0.999 * probe->step(batches, unclipped).grad_norm);
          }
          thresholds.push_back(threshold);
          return threshold;
        });
    const ClipPlan same_thresholds = [&](int step, std::span<const TokenBatch>) {
      return thresholds[step];
    };
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "weights in place" : "weights copied");
      const ScheduleOptions speculative{.weights_in_place = in_place, .speculative_clip = true};
      const TrainingRun layup =
          train(with_options("layup", speculative), micro_batches, same_thresholds);
      expect_same(gpu, layup, "layup, speculative");
      const int blocks = config.n_layer;
      for (int step = 0; step < kSteps; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        EXPECT_EQ(gpu.clip_factors[step] < 1.0f, step % 2 == 1) << "clipped as planned";
        const bool speculating = step == 0 || gpu.clip_factors[step - 1] == 1.0f;
        const bool barely = step % 4 == 1, hard = step % 4 == 3;
        EXPECT_EQ(speculating, step == 0 || step % 2 == 1) << "speculates unless the last step "
                                                              "was clipped";
        EXPECT_EQ(layup.blocks_redone[step], speculating && barely ? blocks : 0);
        EXPECT_EQ(layup.blocks_deferred[step], speculating && hard ? blocks : 0);
      }
    }
  }
}

// The head (embeddings, final norm) updated on the device (ScheduleOptions::update_sites,
// head_on_device: what a discrete GPU runs): the same steps, bit for bit, with deferred and
// speculative clipping, with one micro-batch and with two (the device sums the head's gradient),
// and unclipped from the slots. It needs the device's own copy of the weights.
TEST(SchedulesEquivalence, HeadUpdatedOnTheDeviceTrainsTheSame) {
  const ParameterLayout layout(tiny_config());
  const ScheduleOptions deferred{.update_sites = head_on_device(layout)};
  const ScheduleOptions speculative{.speculative_clip = true,
                                    .update_sites = head_on_device(layout)};
  for (const int micro_batches : {1, 2})
    for (const bool clip : {false, true}) {
      SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                   (clip ? "clipped" : "unclipped"));
      const TrainingRun gpu = train(with_options("gpu", {}), micro_batches, clip);
      expect_same(gpu, train(with_options("layup", deferred), micro_batches, clip),
                  "layup, head on device");
      expect_same(gpu, train(with_options("layup", speculative), micro_batches, clip),
                  "layup, speculative, head on device");
    }
  expect_same(
      train(with_options("gpu", {}), 1, false),
      train(with_options("layup", {.host_gradient = false, .update_sites = head_on_device(layout)}),
            1, false),
      "layup, slots only, head on device");

  const ModelConfig config = tiny_config();
  EXPECT_THROW(cpu_schedule(Mode::kLayup, layout,
                            {.weights_in_place = true, .update_sites = head_on_device(layout)}),
               Error);
}

// Any span may be updated on the device (ScheduleOptions::update_sites), not only the head: block
// 1 of 3 alone, block 1 with the head, and every span. The same steps, bit for bit, with deferred
// and speculative clipping and without, with one micro-batch and with two (the device sums the
// block's gradient), and unclipped from the slots.
TEST(SchedulesEquivalence, BlocksUpdatedOnTheDeviceTrainTheSame) {
  const ParameterLayout layout(tiny_config());
  const size_t spans = layout.spans().size();
  std::vector<UpdateSite> block_1(spans, UpdateSite::kHost);
  block_1[1 + 1] = UpdateSite::kDevice;
  std::vector<UpdateSite> block_1_and_head = head_on_device(layout);
  block_1_and_head[1 + 1] = UpdateSite::kDevice;
  const std::vector<UpdateSite> everything(spans, UpdateSite::kDevice);
  const struct {
    const char* name;
    std::vector<UpdateSite> sites;
  } placements[] = {
      {"block 1", block_1}, {"block 1 and head", block_1_and_head}, {"every span", everything}};
  for (const int micro_batches : {1, 2})
    for (const bool clip : {false, true}) {
      SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                   (clip ? "clipped" : "unclipped"));
      const TrainingRun gpu = train(with_options("gpu", {}), micro_batches, clip);
      for (const auto& [name, sites] : placements) {
        expect_same(gpu, train(with_options("layup", {.update_sites = sites}), micro_batches, clip),
                    std::string("layup, deferred, on the device: ") + name);
        expect_same(gpu,
                    train(with_options("layup", {.speculative_clip = true, .update_sites = sites}),
                          micro_batches, clip),
                    std::string("layup, speculative, on the device: ") + name);
      }
    }
  const TrainingRun gpu = train(with_options("gpu", {}), 1, false);
  for (const auto& [name, sites] : placements)
    expect_same(
        gpu,
        train(with_options("layup", {.host_gradient = false, .update_sites = sites}), 1, false),
        std::string("layup, slots only, on the device: ") + name);

  const ModelConfig config = tiny_config();
  EXPECT_THROW(
      cpu_schedule(Mode::kLayup, layout, {.weights_in_place = true, .update_sites = block_1}),
      Error)
      << "a device-updated block needs the device's copy of the weights";
  EXPECT_THROW(
      cpu_schedule(Mode::kLayup, layout,
                   {.update_sites = std::vector<UpdateSite>(spans - 1, UpdateSite::kHost)}),
      Error)
      << "one site per span";
  std::vector<UpdateSite> blocks_0_to_1 = head_on_device(layout);
  blocks_0_to_1[1] = blocks_0_to_1[2] = UpdateSite::kDevice;
  EXPECT_NE(describe_schedule(Mode::kLayup, {.update_sites = blocks_0_to_1}, 1.0f)
                .find("the embeddings, blocks 0-1 and the final norm are updated on the device"),
            std::string::npos)
      << describe_schedule(Mode::kLayup, {.update_sites = blocks_0_to_1}, 1.0f);
  EXPECT_NE(describe_schedule(Mode::kLayup, {.update_sites = block_1_and_head}, 1.0f)
                .find("the embeddings, block 1 and the final norm are updated on the device"),
            std::string::npos)
      << describe_schedule(Mode::kLayup, {.update_sites = block_1_and_head}, 1.0f);
}

// Blocks 0 and 2 on disk, block 1 and the head (embeddings, final norm) on the device.
std::vector<UpdateSite> disk_device_disk(const ParameterLayout& layout) {
  std::vector<UpdateSite> sites = head_on_device(layout);
  sites[1 + 0] = UpdateSite::kDisk;
  sites[1 + 1] = UpdateSite::kDevice;
  sites[1 + 2] = UpdateSite::kDisk;
  return sites;
}

// Blocks whose optimizer state lives on disk (UpdateSite::kDisk: a file under offload_dir, staged
// through a ring of host slots), mixed with device- and host-updated spans in one run: the same
// steps, bit for bit, with and without clipping (deferred), with one micro-batch and two, unclipped
// from the slots, with one staging slot (every update reads its block again) and with as many as
// disk blocks (nothing is read twice), and with the master weights in place for the host's spans.
TEST(SchedulesEquivalence, BlocksOnDiskTrainTheSame) {
  const ParameterLayout layout(tiny_config());
  const size_t spans = layout.spans().size();
  test_files::TempDir dir;
  const std::vector<UpdateSite> mixed = disk_device_disk(layout);
  std::vector<UpdateSite> host_and_disk(spans, UpdateSite::kHost);
  host_and_disk[1 + 1] = host_and_disk[1 + 2] = UpdateSite::kDisk;
  std::vector<UpdateSite> every_block(spans, UpdateSite::kDisk);
  every_block.front() = every_block.back() = UpdateSite::kHost;
  const struct {
    const char* name;
    ScheduleOptions options;
  } placements[] = {
      {"blocks 0 and 2 on disk, 1 and the head on the device, 1 slot",
       {.update_sites = mixed, .offload_dir = dir.path(), .disk_slots = 1}},
      {"blocks 1-2 on disk, the rest on the host, 3 slots",
       {.update_sites = host_and_disk, .offload_dir = dir.path(), .disk_slots = 3}},
      {"every block on disk, 2 slots, master weights in place",
       {.weights_in_place = true,
        .update_sites = every_block,
        .offload_dir = dir.path(),
        .disk_slots = 2}},
  };
  for (const int micro_batches : {1, 2})
    for (const bool clip : {false, true}) {
      SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                   (clip ? "clipped" : "unclipped"));
      const TrainingRun gpu = train(with_options("gpu", {}), micro_batches, clip);
      EXPECT_NE(gpu.losses.front(), gpu.losses.back());
      for (const auto& [name, options] : placements)
        expect_same(gpu, train(with_options("layup", options), micro_batches, clip),
                    std::string("layup, on disk: ") + name);
    }
  const TrainingRun gpu = train(with_options("gpu", {}), 1, false);
  for (const auto& [name, options] : placements) {
    ScheduleOptions slots_only = options;
    slots_only.host_gradient = false;
    expect_same(gpu, train(with_options("layup", slots_only), 1, false),
                std::string("layup, slots only, on disk: ") + name);
  }
  EXPECT_NE(describe_schedule(Mode::kLayup, placements[0].options, 1.0f)
                .find("block 0 and block 2 keep their optimizer state on disk"),
            std::string::npos)
      << describe_schedule(Mode::kLayup, placements[0].options, 1.0f);
}

// A Llama-family model (biases in attention) across the three tiers: block 0's optimizer state on
// disk under `dir`, block 1 on the host, block 2, the embeddings and the untied head (in the final
// norm's span) on the device.
ModelConfig llama_with_biases() {
  ModelConfig config = llama_config(3, 4, 2, 32, 48, 16, 61);
  config.attention_bias = true;
  return config;
}
ScheduleOptions llama_across_tiers(const ModelConfig& config, const test_files::TempDir& dir) {
  std::vector<UpdateSite> sites = head_on_device(ParameterLayout(config));
  sites[1 + 0] = UpdateSite::kDisk;
  sites[1 + 1] = UpdateSite::kHost;
  sites[1 + 2] = UpdateSite::kDevice;
  return {.update_sites = sites, .offload_dir = dir.path(), .disk_slots = 1};
}

// The Llama family across the three tiers in one run, bit for bit with gpu mode, clipped and not,
// with one micro-batch and two.
TEST(SchedulesEquivalence, TheLlamaFamilyTrainsTheSameAcrossTiers) {
  const ModelConfig config = llama_with_biases();
  test_files::TempDir dir;
  const ScheduleOptions tiers = llama_across_tiers(config, dir);
  for (const int micro_batches : {1, 2})
    for (const bool clip : {false, true}) {
      SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                   (clip ? "clipped" : "unclipped"));
      const TrainingRun gpu = train(with_options("gpu", {}), micro_batches, clip, config);
      EXPECT_NE(gpu.losses.front(), gpu.losses.back());
      expect_same(gpu, train(with_options("layup", tiers), micro_batches, clip, config),
                  "layup, Llama, disk/host/device");
    }
}

// Layer-major accumulation (ScheduleOptions::accumulation): the forward span by span over every
// micro-batch (each micro-batch's residual stream in a hidden state between its blocks), then
// each block's backward of every micro-batch in turn, summed on the device, the host getting one
// gradient a span (and keeping none without clipping). Bit for bit the micro-batch-major run of
// the same options, losses included, with two and three micro-batches, clipped and not, in
// offload and layup with the head on the host and on the device; clipped with three, speculative
// clipping, blocks on disk and on the device, an untied Llama head (the others: GPT-2's tied
// one), bf16 and 8-bit moments, the master weights in place, and targets masked differently in
// each micro-batch (each micro-batch's forward sees its own tokens and targets).
TEST(SchedulesEquivalence, LayerMajorAccumulationTrainsLikeMicroBatchMajor) {
  const ParameterLayout layout(tiny_config());
  test_files::TempDir dir;
  const ModelConfig llama = llama_with_biases();
  const struct {
    const char* name;
    const char* mode;
    ScheduleOptions options;
    ModelConfig config;
    bool every_count_and_clipping;  // else three micro-batches, clipped
    bool masked = false;
  } runs[] = {
      {"offload", "offload", {}, tiny_config(), true},
      {"layup, the head on the host", "layup", {}, tiny_config(), true},
      {"layup, the head on the device",
       "layup",
       {.update_sites = head_on_device(layout)},
       tiny_config(),
       true},
      {"layup, speculative clipping", "layup", {.speculative_clip = true}, tiny_config(), false},
      {"layup, blocks on disk and on the device",
       "layup",
       {.update_sites = disk_device_disk(layout), .offload_dir = dir.path(), .disk_slots = 1},
       tiny_config(),
       false},
      {"layup, Llama across tiers", "layup", llama_across_tiers(llama, dir), llama, false},
      {"layup, bf16 moments",
       "layup",
       {.optimizer_state = OptimizerStateKind::kBf16},
       tiny_config(),
       false},
      {"offload, 8-bit moments",
       "offload",
       {.optimizer_state = OptimizerStateKind::kBlockwise8Bit},
       tiny_config(),
       false},
      {"layup, speculative clipping, 8-bit moments, the head on the device",
       "layup",
       {.speculative_clip = true,
        .update_sites = head_on_device(layout),
        .optimizer_state = OptimizerStateKind::kBlockwise8Bit},
       tiny_config(),
       false},
      {"layup, master weights in place", "layup", {.weights_in_place = true}, tiny_config(), true},
      {"layup, masked targets", "layup", {}, tiny_config(), true, true},
      {"offload, every block streamed, bf16 moments",
       "offload",
       {.optimizer_state = OptimizerStateKind::kBf16, .streamed_blocks = 3},
       tiny_config(),
       true},
      {"layup, speculative clipping, two blocks streamed, 8-bit moments",
       "layup",
       {.speculative_clip = true,
        .optimizer_state = OptimizerStateKind::kBlockwise8Bit,
        .streamed_blocks = 2},
       tiny_config(),
       false},
      {"offload, masked targets, Llama", "offload", {}, llama, false, true},
  };
  for (const int micro_batches : {2, 3})
    for (const bool clip : {false, true})
      for (const auto& [name, mode, options, config, every, masked] : runs) {
        if (!every && !(micro_batches == 3 && clip)) continue;
        SCOPED_TRACE(std::string(name) + ", " + std::to_string(micro_batches) + " micro-batches, " +
                     (clip ? "clipped" : "unclipped"));
        const TrainingRun micro_batch_major = train(with_options(mode, options), micro_batches,
                                                    alternating_clip(clip), config, {}, masked);
        EXPECT_NE(micro_batch_major.losses.front(), micro_batch_major.losses.back());
        ScheduleOptions layer_major = options;
        layer_major.accumulation = Accumulation::kLayerMajor;
        // As the run's plan chooses: a host gradient only to clip.
        layer_major.host_gradient = clip || options.speculative_clip;
        expect_same(micro_batch_major,
                    train(with_options(mode, layer_major), micro_batches, alternating_clip(clip),
                          config, {}, masked),
                    std::string(mode) + ", layer-major");
      }
}

// Streamed weights (ScheduleOptions::streamed_blocks): blocks that compute from a ring of slots
// filled from the host before each forward and backward train bit for bit like gpu mode (and so
// like resident weights in every mode), in offload and layup, with clipping (deferred and
// speculative) and without, one micro-batch and two in both orders, the head and blocks in every
// tier, the weights in place or copied; one block through one slot, two, and every block through
// two slots (they rotate).
TEST(SchedulesEquivalence, StreamedWeightsTrainLikeResidentOnes) {
  const ParameterLayout layout(tiny_config());
  test_files::TempDir dir;
  std::vector<UpdateSite> tiers = head_on_device(layout);
  tiers[1 + 0] = UpdateSite::kDevice;
  tiers[1 + 2] = UpdateSite::kDisk;
  std::vector<UpdateSite> every_block_on_disk(layout.spans().size(), UpdateSite::kDisk);
  every_block_on_disk.front() = every_block_on_disk.back() = UpdateSite::kHost;
  const Accumulation mbm = Accumulation::kMicroBatchMajor, lm = Accumulation::kLayerMajor;
  const struct {
    const char* name;
    const char* mode;
    ScheduleOptions options;
    int micro_batches;
    bool clip;
  } runs[] = {
      {"offload", "offload", {.streamed_blocks = 3}, 1, true},
      {"offload, weights in place, layer-major",
       "offload",
       {.weights_in_place = true, .accumulation = lm, .streamed_blocks = 3},
       2,
       false},
      {"layup, updates during backward", "layup", {.streamed_blocks = 3}, 1, false},
      {"layup, one block through one slot", "layup", {.streamed_blocks = 1}, 1, false},
      {"layup, no host gradient",
       "layup",
       {.host_gradient = false, .streamed_blocks = 3},
       1,
       false},
      {"layup, no host gradient, layer-major",
       "layup",
       {.host_gradient = false, .accumulation = lm, .streamed_blocks = 3},
       2,
       false},
      {"layup, speculative clipping",
       "layup",
       {.speculative_clip = true, .accumulation = mbm, .streamed_blocks = 3},
       2,
       true},
      {"layup, speculative clipping, layer-major, three micro-batches",
       "layup",
       {.speculative_clip = true, .accumulation = lm, .streamed_blocks = 3},
       3,
       true},
      {"layup, deferred clipping, the head on the device, layer-major",
       "layup",
       {.update_sites = head_on_device(layout), .accumulation = lm, .streamed_blocks = 3},
       2,
       true},
      {"layup, weights in place",
       "layup",
       {.weights_in_place = true, .streamed_blocks = 2},
       2,
       false},
      // A streamed block on disk fills from a host copy of its weights alone (the disk block
      // streamed first, as the last the host updates).
      {"layup, a block on the device, one on disk",
       "layup",
       {.update_sites = tiers, .offload_dir = dir.path(), .disk_slots = 1, .streamed_blocks = 1},
       1,
       true},
      {"layup, every block on disk, streamed, layer-major",
       "layup",
       {.update_sites = every_block_on_disk,
        .offload_dir = dir.path(),
        .disk_slots = 2,
        .accumulation = lm,
        .streamed_blocks = 3},
       2,
       true},
      {"layup, every block on disk, two streamed, weights in place",
       "layup",
       {.weights_in_place = true,
        .update_sites = every_block_on_disk,
        .offload_dir = dir.path(),
        .disk_slots = 1,
        .streamed_blocks = 2},
       1,
       false},
  };
  std::map<std::pair<int, bool>, TrainingRun> gpu;
  for (const auto& [name, mode, options, micro_batches, clip] : runs) {
    SCOPED_TRACE(name);
    const auto key = std::make_pair(micro_batches, clip);
    if (gpu.count(key) == 0) gpu[key] = train(with_options("gpu", {}), micro_batches, clip);
    EXPECT_NE(gpu[key].losses.front(), gpu[key].losses.back());
    expect_same(gpu[key], train(with_options(mode, options), micro_batches, clip), name);
  }
}

// A streamed run resumes bit for bit: its state out after three steps (export_span reads the host's
// master weights, the ring holds only copies), into a new streamed run, three more steps; and a
// forward outside a step (evaluate: each block filled just before it is read) sees the weights a
// resident run sees.
TEST(SchedulesEquivalence, StreamedRunsResumeAndEvaluateBitForBit) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  ResumeSteps steps(config, 1000);
  const ScheduleOptions streamed{.speculative_clip = true, .streamed_blocks = 3};
  std::unique_ptr<Schedule> unbroken = cpu_schedule(Mode::kGpu, layout);
  unbroken->import_tensors(fresh_optimizer_tensors(layout, 7));
  steps.run(*unbroken, 0, 6);
  const OptimizerTensors expected = unbroken->export_tensors();
  const float expected_loss = unbroken->evaluate(steps.batch(99));

  std::unique_ptr<Schedule> first = cpu_schedule(Mode::kLayup, layout, streamed);
  first->import_tensors(fresh_optimizer_tensors(layout, 7));
  steps.run(*first, 0, 3);
  const OptimizerTensors checkpoint = first->export_tensors();
  std::unique_ptr<Schedule> resumed = cpu_schedule(Mode::kLayup, layout, streamed);
  resumed->import_tensors(checkpoint);
  steps.run(*resumed, 3, 6);
  expect_same_tensors(expected, resumed->export_tensors(), "resumed");
  const float loss = resumed->evaluate(steps.batch(99));
  EXPECT_EQ(std::memcmp(&loss, &expected_loss, sizeof loss), 0) << loss << " " << expected_loss;
}

// Blocks 0 and 2 staged through the device (UpdateSite::kStaged: their state on the host, their
// AdamW on the device), block 1 on the host.
std::vector<UpdateSite> staged_0_and_2(const ParameterLayout& layout,
                                       std::vector<UpdateSite> sites = {}) {
  if (sites.empty()) sites.assign(layout.spans().size(), UpdateSite::kHost);
  sites[1 + 0] = sites[1 + 2] = UpdateSite::kStaged;
  return sites;
}

// Staged blocks (UpdateSite::kStaged): the gradient and the host's state copied into a slot on
// the device, the device's AdamW there (on the CPU backend the host's AdamW loops, as the CPU
// workers run them), the state copied back. They train bit for bit like host-updated blocks (and
// so like gpu mode), in offload and layup, clipped (deferred and speculative) and not, one
// micro-batch and two in both orders, beside blocks on the device, with one slot and two, with
// the master weights in place (the slot holds them) and copied (the device copy is updated in
// place), and with no host gradient (the update reads the slot's landing buffer).
TEST(SchedulesEquivalence, StagedBlocksTrainLikeHostUpdatedOnes) {
  const ParameterLayout layout(tiny_config());
  const size_t spans = layout.spans().size();
  const std::vector<UpdateSite> staged = staged_0_and_2(layout);
  std::vector<UpdateSite> every_block(spans, UpdateSite::kStaged);
  every_block.front() = every_block.back() = UpdateSite::kHost;
  std::vector<UpdateSite> beside_device = staged_0_and_2(layout, head_on_device(layout));
  beside_device[1 + 1] = UpdateSite::kDevice;
  const Accumulation lm = Accumulation::kLayerMajor;
  const struct {
    const char* name;
    const char* mode;
    ScheduleOptions options;
    std::vector<std::pair<int, bool>> runs;  // micro-batches, clipping
  } placements[] = {
      {"offload", "offload", {.update_sites = staged}, {{1, true}, {2, false}, {2, true}}},
      {"offload, layer-major, weights in place",
       "offload",
       {.weights_in_place = true, .update_sites = staged, .accumulation = lm},
       {{2, true}, {3, false}}},
      {"layup, deferred",
       "layup",
       {.update_sites = staged},
       {{1, false}, {1, true}, {2, false}, {2, true}}},
      {"layup, speculative",
       "layup",
       {.speculative_clip = true, .update_sites = staged},
       {{1, true}, {2, true}}},
      {"layup, every block staged through one slot",
       "layup",
       {.update_sites = every_block, .staging_slots = 1},
       {{1, false}, {2, true}}},
      {"layup, beside the head and block 1 on the device, speculative",
       "layup",
       {.speculative_clip = true, .update_sites = beside_device},
       {{1, false}, {2, true}}},
      {"layup, weights in place",
       "layup",
       {.weights_in_place = true, .update_sites = staged},
       {{1, false}, {2, true}}},
      {"layup, layer-major, no host gradient",
       "layup",
       {.host_gradient = false, .update_sites = staged, .accumulation = lm},
       {{2, false}, {3, false}}},
      {"layup, layer-major, deferred",
       "layup",
       {.update_sites = staged, .accumulation = lm},
       {{3, true}}},
      {"layup, slots only",
       "layup",
       {.host_gradient = false, .update_sites = staged},
       {{1, false}}},
      // 12,704 elements a block: 12 parts of 1,024 and one of 416, through two slots.
      {"layup, in parts",
       "layup",
       {.update_sites = staged, .staging_part_elements = 1024},
       {{1, false}, {2, true}}},
      {"layup, in parts, every block streamed, layer-major",
       "layup",
       {.host_gradient = false,
        .update_sites = staged,
        .staging_part_elements = 1024,
        .accumulation = lm,
        .streamed_blocks = 3},
       {{1, false}, {3, false}}},
      {"offload, in parts, the staged blocks streamed",
       "offload",
       {.update_sites = staged, .staging_part_elements = 4096, .streamed_blocks = 2},
       {{2, true}}},
  };
  std::map<std::pair<int, bool>, TrainingRun> gpu;
  for (const auto& [name, mode, options, runs] : placements)
    for (const auto& [micro_batches, clip] : runs) {
      SCOPED_TRACE(std::string(name) + ", " + std::to_string(micro_batches) + " micro-batches, " +
                   (clip ? "clipped" : "unclipped"));
      const auto key = std::make_pair(micro_batches, clip);
      if (gpu.count(key) == 0) gpu[key] = train(with_options("gpu", {}), micro_batches, clip);
      EXPECT_NE(gpu[key].losses.front(), gpu[key].losses.back());
      expect_same(gpu[key], train(with_options(mode, options), micro_batches, clip), name);
    }
  EXPECT_NE(describe_schedule(Mode::kLayup, {.update_sites = staged}, 1.0f)
                .find("block 0 and block 2 keep their optimizer state on the host and are "
                      "updated by the device's AdamW"),
            std::string::npos)
      << describe_schedule(Mode::kLayup, {.update_sites = staged}, 1.0f);
}

// A run with staged blocks resumes bit for bit: their state goes out and in as a host block's
// (export_span reads the host's store once the copies back have landed), in layup and into gpu
// mode and back.
TEST(SchedulesEquivalence, StagedBlocksSurviveACheckpoint) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  ResumeSteps steps(config, 500);
  const ScheduleOptions staged{.speculative_clip = true, .update_sites = staged_0_and_2(layout)};
  std::unique_ptr<Schedule> unbroken = cpu_schedule(Mode::kGpu, layout);
  unbroken->import_tensors(fresh_optimizer_tensors(layout, 7));
  steps.run(*unbroken, 0, 6);
  const OptimizerTensors expected = unbroken->export_tensors();
  for (const Mode second : {Mode::kLayup, Mode::kGpu}) {
    SCOPED_TRACE(name_of(second));
    std::unique_ptr<Schedule> first = cpu_schedule(Mode::kLayup, layout, staged);
    first->import_tensors(fresh_optimizer_tensors(layout, 7));
    steps.run(*first, 0, 3);
    std::unique_ptr<Schedule> resumed = cpu_schedule(second, layout, staged);
    resumed->import_tensors(first->export_tensors());
    steps.run(*resumed, 3, 6);
    expect_same_tensors(expected, resumed->export_tensors(), "resumed");
  }
}

// What staged blocks refuse: the head staged, and blocks on disk in the same run.
TEST(SchedulesEquivalence, StagedBlocksRefuseWhatTheyCannotDo) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  test_files::TempDir dir;
  const auto message = [&](const ScheduleOptions& options) {
    try {
      cpu_schedule(Mode::kLayup, layout, options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  std::vector<UpdateSite> head = staged_0_and_2(layout);
  head.front() = UpdateSite::kStaged;
  const std::string embeddings = message({.update_sites = head});
  EXPECT_NE(embeddings.find("only blocks"), std::string::npos) << embeddings;
  std::vector<UpdateSite> with_disk = staged_0_and_2(layout);
  with_disk[1 + 1] = UpdateSite::kDisk;
  const std::string disk = message({.update_sites = with_disk, .offload_dir = dir.path()});
  EXPECT_NE(disk.find("not supported yet"), std::string::npos) << disk;
  EXPECT_EQ(message({.update_sites = staged_0_and_2(layout)}), "(accepted)");
}

// What the disk tier refuses before a step: no directory, speculative clipping (no second copy of
// the state on disk), a directory that does not exist, the head on disk.
TEST(SchedulesEquivalence, BlocksOnDiskRefuseWhatTheyCannotDo) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  test_files::TempDir dir;
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kHost);
  sites[1 + 1] = UpdateSite::kDisk;
  const auto make = [&](const ScheduleOptions& options) {
    return cpu_schedule(Mode::kLayup, layout, options);
  };
  const auto message = [&](const ScheduleOptions& options) {
    try {
      make(options);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({.update_sites = sites}).find("--offload-dir"), std::string::npos)
      << message({.update_sites = sites});
  const std::string speculative =
      message({.speculative_clip = true, .update_sites = sites, .offload_dir = dir.path()});
  EXPECT_NE(speculative.find("--layup-clip deferred"), std::string::npos) << speculative;
  const std::string missing = message({.update_sites = sites, .offload_dir = dir.file("none")});
  EXPECT_NE(missing.find(dir.file("none")), std::string::npos) << missing;
  std::vector<UpdateSite> head = sites;
  head.front() = UpdateSite::kDisk;
  const std::string embeddings = message({.update_sites = head, .offload_dir = dir.path()});
  EXPECT_NE(embeddings.find("only blocks"), std::string::npos) << embeddings;
}

// A checkpoint of a run with device-updated spans (and a block on disk) holds their state as the
// device (the disk) has it: what
// export_tensors gives, import_tensors puts back (the moments into device memory, which the
// accountant sees), and training on from it, in layup with the same sites or in gpu mode, takes
// the same steps as a run that never stopped.
TEST(SchedulesEquivalence, DeviceUpdatedSpansSurviveACheckpoint) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  std::vector<UpdateSite> sites = head_on_device(layout);
  sites[1 + 1] = UpdateSite::kDevice;
  sites[1 + 2] = UpdateSite::kDisk;
  test_files::TempDir dir;
  const ScheduleOptions options{.update_sites = sites, .offload_dir = dir.path()};
  ResumeSteps steps(config, 1000);
  std::unique_ptr<Schedule> unbroken = cpu_schedule(Mode::kLayup, layout, options);
  unbroken->import_tensors(fresh_optimizer_tensors(layout, 7));
  steps.run(*unbroken, 0, 6);
  const OptimizerTensors expected = unbroken->export_tensors();

  std::unique_ptr<Schedule> first = cpu_schedule(Mode::kLayup, layout, options);
  first->import_tensors(fresh_optimizer_tensors(layout, 7));
  steps.run(*first, 0, 3);
  const OptimizerTensors checkpoint = first->export_tensors();
  EXPECT_NE(checkpoint.adam_v[layout.spans()[2].offset], 0.0f) << "block 1's moments";

  auto accountant = std::make_shared<MemoryAccountant>();
  std::unique_ptr<Schedule> resumed = cpu_schedule(Mode::kLayup, layout, options, accountant);
  const size_t on_device =
      layout.embeddings().count + layout.block().count + layout.final_norm().count;
  EXPECT_EQ(accountant->cell(MemorySide::kDevice, TensorClass::kOptimizerMoments, MemoryKind::kHost)
                .current,
            2 * on_device * sizeof(float))
      << "m and v of the device-updated spans, in device memory";
  EXPECT_EQ(
      accountant->cell(MemorySide::kHost, TensorClass::kMasterWeights, MemoryKind::kHost).current,
      (layout.total_count() - on_device - layout.block().count) * sizeof(float))
      << "the host keeps the master weights of the spans it keeps the state of (not those on "
         "the device or on disk)";
  resumed->import_tensors(checkpoint);
  expect_same_tensors(checkpoint, resumed->export_tensors(), "exported as imported");
  steps.run(*resumed, 3, 6);
  expect_same_tensors(expected, resumed->export_tensors(), "resumed in layup");

  std::unique_ptr<Schedule> gpu = cpu_schedule(Mode::kGpu, layout);
  gpu->import_tensors(checkpoint);
  steps.run(*gpu, 3, 6);
  expect_same_tensors(expected, gpu->export_tensors(), "resumed in gpu mode");
}

// A fresh run's state, imported span by span (Schedule::initialize_fresh, one span's worth of host
// memory), is the whole-model fresh_optimizer_tensors, in every mode and placement.
TEST(SchedulesEquivalence, InitializedSpanBySpanAsWhole) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  std::vector<UpdateSite> sites = head_on_device(layout);
  sites[1 + 1] = UpdateSite::kDevice;
  sites[1 + 2] = UpdateSite::kDisk;
  test_files::TempDir dir;
  const OptimizerTensors expected = fresh_optimizer_tensors(layout, 11);
  for (const Mode mode : {Mode::kGpu, Mode::kOffload, Mode::kLayup}) {
    SCOPED_TRACE(name_of(mode));
    const ScheduleOptions options =
        mode == Mode::kLayup ? ScheduleOptions{.update_sites = sites, .offload_dir = dir.path()}
                             : ScheduleOptions{};
    std::unique_ptr<Schedule> schedule = cpu_schedule(mode, layout, options);
    schedule->initialize_fresh(11);
    const OptimizerTensors got = schedule->export_tensors();
    expect_same_tensors(expected, got, "initialized span by span");
    // One part alone (a checkpoint's weights pass): the others are not touched.
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      const Span& span = layout.spans()[index];
      std::vector<float> params(span.count, -1.0f);
      schedule->export_span(index, {params.data(), nullptr, nullptr});
      EXPECT_EQ(std::memcmp(params.data(), expected.params.data() + span.offset,
                            span.count * sizeof(float)),
                0)
          << "span " << index;
    }
  }
}

// The moments of `tensors` coded span by span in `kind` (8-bit blocks from each span's first
// element, as every schedule codes them) and decoded again.
OptimizerTensors with_coded_moments(const ParameterLayout& layout, OptimizerTensors tensors,
                                    OptimizerStateKind kind) {
  for (const Span& span : layout.spans()) {
    std::vector<float> coded(optimizer_moments_bytes(kind, span.count) / sizeof(float) + 1);
    const AdamWMoments moments = AdamWMoments::in_buffer(kind, coded.data(), span.count);
    float* m = tensors.adam_m.data() + span.offset;
    float* v = tensors.adam_v.data() + span.offset;
    encode_moments(m, v, span.count, moments);
    decode_moments(moments, span.count, m, v);
  }
  return tensors;
}

// gpu mode with bf16 or 8-bit moments, step by step, is the fp32 update from the decoded moments
// with its new moments then coded (docs/optimizer_state.md): the weights bit for bit those of an
// fp32 step from the same state, the moments those of that step coded span by span. Two
// micro-batches a step, clipped on every other step.
TEST(SchedulesEquivalence, CompactStateInGpuModeIsTheFp32UpdateWithItsMomentsCoded) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  for (const OptimizerStateKind kind :
       {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    SCOPED_TRACE(name_of(kind));
    auto make = [&](OptimizerStateKind state) {
      return cpu_schedule(Mode::kGpu, layout, {.optimizer_state = state});
    };
    std::unique_ptr<Schedule> compact = make(kind), exact = make(OptimizerStateKind::kFp32);
    compact->import_tensors(fresh_optimizer_tensors(layout, 7));
    std::mt19937 rng(5);
    std::vector<int32_t> tokens(4 * kBatch * kSeqLen);
    float first_loss = 0.0f, last_loss = 0.0f;
    for (int step = 0; step < 4; ++step) {
      exact->import_tensors(compact->export_tensors());
      for (int32_t& token : tokens) token = static_cast<int32_t>(rng() % config.vocab_size);
      const size_t n = kBatch * kSeqLen;
      const std::vector<TokenBatch> batches = {
          {tokens.data(), tokens.data() + n, kBatch, kSeqLen},
          {tokens.data() + 2 * n, tokens.data() + 3 * n, kBatch, kSeqLen}};
      UpdateSettings settings;
      settings.adamw.hyper.lr = 1e-2f;
      settings.adamw.t = step + 1;
      settings.clip_max_norm = step % 2 == 0 ? 1e-3f : 1e6f;
      const StepStats got = compact->step(batches, settings);
      const StepStats expected = exact->step(batches, settings);
      ASSERT_TRUE(got.applied);
      EXPECT_EQ(got.loss, expected.loss);
      EXPECT_EQ(got.clip_factor, expected.clip_factor);
      (step == 0 ? first_loss : last_loss) = got.loss;
      const OptimizerTensors coded = with_coded_moments(layout, exact->export_tensors(), kind);
      const OptimizerTensors state = compact->export_tensors();
      EXPECT_TRUE(bitwise_equal(coded.params, state.params)) << "step " << step;
      EXPECT_TRUE(bitwise_equal(coded.adam_m, state.adam_m)) << "step " << step;
      EXPECT_TRUE(bitwise_equal(coded.adam_v, state.adam_v)) << "step " << step;
      // The coding loses something: the test would pass for fp32 moments too otherwise.
      const OptimizerTensors plain = exact->export_tensors();
      EXPECT_FALSE(bitwise_equal(plain.adam_v, state.adam_v)) << "step " << step;
    }
    EXPECT_NE(first_loss, last_loss);
  }
}

// The run's choice reaches the schedule and its log line, which says that a compact kind is lossy.
TEST(SchedulesEquivalence, TheOptimizerStateKindIsCarriedAndNamed) {
  MemoryPlanRequest request;
  request.config = tiny_config();
  request.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  for (const Mode mode : {Mode::kGpu, Mode::kOffload, Mode::kLayup}) {
    request.mode = mode;
    const ScheduleOptions options =
        choose_schedule_options(request, resolve_placement(mode, request.attributes, {}), 0);
    EXPECT_EQ(options.optimizer_state, OptimizerStateKind::kBlockwise8Bit) << name_of(mode);
    EXPECT_NE(describe_schedule(mode, options, 1.0f)
                  .find("; optimizer state: 8bit (blockwise 8-bit moments, lossy"),
              std::string::npos)
        << describe_schedule(mode, options, 1.0f);
  }
  EXPECT_NE(describe_schedule(Mode::kLayup, {}, 1.0f).find("; optimizer state: fp32"),
            std::string::npos);
}

// gpu == offload == layup with bf16 and 8-bit moments too, bit for bit: every placement (host,
// device, disk), clipping deferred and speculative and none (updates overlapping the backward),
// one micro-batch and two, and the state exported and imported again (initialize_fresh).
class CompactStateEquivalence : public testing::TestWithParam<OptimizerStateKind> {
 protected:
  ScheduleOptions with_kind(ScheduleOptions options) const {
    options.optimizer_state = GetParam();
    return options;
  }
  TrainingRun gpu(int micro_batches, bool clip, const ModelConfig& config = tiny_config()) const {
    return train(with_options("gpu", with_kind({})), micro_batches, clip, config);
  }
};

TEST_P(CompactStateEquivalence, EveryModeTrainsTheSame) {
  for (const auto& [micro_batches, clip] : {std::pair{2, true}, {1, false}, {2, false}}) {
    SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                 (clip ? "clipped" : "unclipped"));
    const TrainingRun expected = gpu(micro_batches, clip);
    EXPECT_NE(expected.losses.front(), expected.losses.back());
    // Not fp32's moments: the kind reached the schedule.
    const TrainingRun fp32 = train(with_options("gpu", {}), micro_batches, clip);
    EXPECT_FALSE(bitwise_equal(fp32.tensors.adam_v, expected.tensors.adam_v));
    expect_same(expected, train(with_options("offload", with_kind({})), micro_batches, clip),
                "offload");
    expect_same(expected, train(with_options("layup", with_kind({})), micro_batches, clip),
                "layup, deferred");
    expect_same(
        expected,
        train(with_options("layup", with_kind({.speculative_clip = true})), micro_batches, clip),
        "layup, speculative");
    expect_same(
        expected,
        train(with_options("layup", with_kind({.weights_in_place = true})), micro_batches, clip),
        "layup, weights in place");
  }
  expect_same(gpu(1, false),
              train(with_options("layup", with_kind({.host_gradient = false})), 1, false),
              "layup, slots only");
}

TEST_P(CompactStateEquivalence, EveryPlacementTrainsTheSame) {
  const ParameterLayout layout(tiny_config());
  const size_t spans = layout.spans().size();
  test_files::TempDir dir;
  const std::vector<UpdateSite> mixed = disk_device_disk(layout);
  std::vector<UpdateSite> block_1_and_head = head_on_device(layout);
  block_1_and_head[1 + 1] = UpdateSite::kDevice;
  std::vector<UpdateSite> every_block(spans, UpdateSite::kDisk);
  every_block.front() = every_block.back() = UpdateSite::kHost;
  const struct {
    const char* name;
    ScheduleOptions options;
  } placements[] = {
      {"block 1 and the head on the device, deferred", {.update_sites = block_1_and_head}},
      {"block 1 and the head on the device, speculative",
       {.speculative_clip = true, .update_sites = block_1_and_head}},
      {"blocks 0 and 2 on disk, 1 and the head on the device, 1 slot",
       {.update_sites = mixed, .offload_dir = dir.path(), .disk_slots = 1}},
      {"every block on disk, 2 slots, master weights in place",
       {.weights_in_place = true,
        .update_sites = every_block,
        .offload_dir = dir.path(),
        .disk_slots = 2}},
  };
  for (const auto& [micro_batches, clip] : {std::pair{2, true}, {1, false}}) {
    SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                 (clip ? "clipped" : "unclipped"));
    const TrainingRun expected = gpu(micro_batches, clip);
    for (const auto& [name, options] : placements)
      expect_same(expected, train(with_options("layup", with_kind(options)), micro_batches, clip),
                  name);
  }
}

// Staged blocks with compact moments: the slot holds the coded moments as the host's store keeps
// them, and the device's AdamW codes them as the CPU workers would.
TEST_P(CompactStateEquivalence, StagedBlocksTrainTheSame) {
  const ParameterLayout layout(tiny_config());
  const std::vector<UpdateSite> staged = staged_0_and_2(layout);
  const struct {
    const char* name;
    const char* mode;
    ScheduleOptions options;
  } placements[] = {
      {"offload, staged", "offload", {.update_sites = staged}},
      {"layup, staged, deferred", "layup", {.update_sites = staged}},
      {"layup, staged, speculative", "layup", {.speculative_clip = true, .update_sites = staged}},
      {"layup, staged, weights in place",
       "layup",
       {.weights_in_place = true, .update_sites = staged, .staging_slots = 1}},
      // Parts of 768: three 8-bit blocks of the moments each, the last part a partial block.
      {"layup, staged in parts, streamed",
       "layup",
       {.update_sites = staged, .staging_part_elements = 768, .streamed_blocks = 3}},
  };
  for (const auto& [micro_batches, clip] : {std::pair{2, true}, {1, false}}) {
    SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches, " +
                 (clip ? "clipped" : "unclipped"));
    const TrainingRun expected = gpu(micro_batches, clip);
    for (const auto& [name, mode, options] : placements)
      expect_same(expected, train(with_options(mode, with_kind(options)), micro_batches, clip),
                  name);
  }
}

TEST_P(CompactStateEquivalence, TheLlamaFamilyTrainsTheSameAcrossTiers) {
  const ModelConfig config = llama_with_biases();
  test_files::TempDir dir;
  const ScheduleOptions tiers = llama_across_tiers(config, dir);
  expect_same(gpu(2, true, config), train(with_options("layup", with_kind(tiers)), 2, true, config),
              "layup, Llama, disk/host/device");
}

// A span's coded moments (SpanState::coded) carry the state out of a schedule and into another
// bit for bit: 5 steps in gpu mode, the state handed span by span to layup with its spans on the
// device, the host and the disk (or to ZeRO-free gpu again), 5 more steps: the 10 steps of a run
// that never stopped. Two micro-batches, clipped on every other step.
TEST_P(CompactStateEquivalence, CodedStateCarriesARunOnBitForBit) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  test_files::TempDir dir;
  std::vector<UpdateSite> mixed = head_on_device(layout);
  mixed[1 + 0] = UpdateSite::kDisk;
  mixed[1 + 2] = UpdateSite::kDevice;
  std::mt19937 rng(77);
  const size_t n = kBatch * kSeqLen;
  std::vector<std::vector<int32_t>> tokens(kSteps, std::vector<int32_t>(4 * n));
  for (std::vector<int32_t>& step : tokens)
    for (int32_t& token : step) token = static_cast<int32_t>(rng() % config.vocab_size);
  auto run = [&](Schedule& schedule, int first, int last, std::vector<float>& losses) {
    for (int step = first; step < last; ++step) {
      const int32_t* t = tokens[step].data();
      const std::vector<TokenBatch> batches = {{t, t + n, kBatch, kSeqLen},
                                               {t + 2 * n, t + 3 * n, kBatch, kSeqLen}};
      UpdateSettings settings;
      settings.adamw.hyper.lr = 1e-2f;
      settings.adamw.t = step + 1;
      settings.clip_max_norm = step % 2 == 0 ? 1e-3f : 1e6f;
      losses.push_back(schedule.step(batches, settings).loss);
    }
  };
  auto make = [&](Mode mode, const ScheduleOptions& options) {
    return cpu_schedule(mode, layout, with_kind(options));
  };
  std::vector<float> straight_losses;
  std::unique_ptr<Schedule> straight = make(Mode::kGpu, {});
  straight->import_tensors(fresh_optimizer_tensors(layout, 3));
  run(*straight, 0, kSteps, straight_losses);
  const OptimizerTensors expected = straight->export_tensors();

  for (const auto& [mode, options] :
       {std::pair{
            Mode::kLayup,
            ScheduleOptions{.update_sites = mixed, .offload_dir = dir.path(), .disk_slots = 1}},
        std::pair{Mode::kLayup, ScheduleOptions{.update_sites = staged_0_and_2(layout)}},
        std::pair{Mode::kGpu, ScheduleOptions{}}}) {
    SCOPED_TRACE(name_of(mode));
    std::vector<float> losses;
    std::unique_ptr<Schedule> first = make(Mode::kGpu, {});
    first->import_tensors(fresh_optimizer_tensors(layout, 3));
    run(*first, 0, kSteps / 2, losses);
    std::unique_ptr<Schedule> second = make(mode, options);
    EXPECT_EQ(second->optimizer_state(), GetParam());
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      const Span& span = layout.spans()[index];
      std::vector<float> params(span.count);
      std::vector<float> coded(optimizer_moments_padded_bytes(GetParam(), span.count) / 4);
      first->export_span(index, {params.data(), nullptr, nullptr, coded.data()});
      second->import_span(index, {params.data(), nullptr, nullptr, coded.data()});
      // And back out of the second, coded and decoded, as the first has them.
      std::vector<float> again(coded.size(), -1.0f), m(span.count), v(span.count),
          first_m(span.count), first_v(span.count);
      second->export_span(index, {nullptr, nullptr, nullptr, again.data()});
      EXPECT_TRUE(bitwise_equal(coded, again)) << "span " << index;
      second->export_span(index, {nullptr, m.data(), v.data()});
      first->export_span(index, {nullptr, first_m.data(), first_v.data()});
      EXPECT_TRUE(bitwise_equal(m, first_m) && bitwise_equal(v, first_v)) << "span " << index;
    }
    run(*second, kSteps / 2, kSteps, losses);
    EXPECT_TRUE(bitwise_equal(losses, straight_losses));
    expect_same_tensors(expected, second->export_tensors(), "resumed");
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, CompactStateEquivalence,
                         testing::Values(OptimizerStateKind::kBf16,
                                         OptimizerStateKind::kBlockwise8Bit),
                         [](const testing::TestParamInfo<OptimizerStateKind>& info) {
                           return info.param == OptimizerStateKind::kBf16 ? std::string("bf16")
                                                                          : std::string("8bit");
                         });

TEST(SchedulesEquivalence, LayupWithoutHostGradientRefusesToClipOrAccumulate) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  std::unique_ptr<Schedule> schedule = cpu_schedule(Mode::kLayup, layout, {.host_gradient = false});
  std::vector<int32_t> tokens(kBatch * kSeqLen, 1);
  const TokenBatch batch{tokens.data(), tokens.data(), kBatch, kSeqLen};
  const TokenBatch two[] = {batch, batch};
  UpdateSettings settings;
  settings.adamw.t = 1;
  settings.clip_max_norm = 1.0f;
  try {
    schedule->step(std::span(two, 1), settings);
    FAIL() << "clipping was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot clip"), std::string::npos) << error.what();
  }
  settings.clip_max_norm = 0.0f;
  EXPECT_THROW(schedule->step(two, settings), Error);
  EXPECT_TRUE(schedule->step(std::span(two, 1), settings).applied);
}

// Several ranks, started by mpirun (tests/oracle/test_data_parallel.py runs this suite as two
// ranks; as one process it skips): each rank takes one micro-batch of a step of N, and every mode
// and placement, layup's device-updated spans among them (summed over the ranks where they are,
// not in the host accumulator), ends bitwise like one process taking all N. Steps clip, do not
// clip, and have no clipping (layup then updates blocks during backward).
TEST(RanksEquivalence, EveryModeAndPlacementTrainsLikeOneProcess) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  if (world->size() < 2)
    GTEST_SKIP() << "one process: mpirun -np 2 runs this (test_data_parallel.py)";
  const int ranks = world->size();
  const ParameterLayout layout(tiny_config());
  std::vector<UpdateSite> head_and_block_0 = head_on_device(layout);
  head_and_block_0[1] = UpdateSite::kDevice;
  const std::vector<UpdateSite> every_span_on_device(layout.spans().size(), UpdateSite::kDevice);
  struct Case {
    std::string name, mode;
    ScheduleOptions options;
    int micro_batches_per_rank = 1;
    ModelConfig config = tiny_config();
  };
  const std::vector<Case> cases = {
      {"gpu", "gpu", {}},
      {"offload", "offload", {}},
      {"layup, head on the device, deferred", "layup", {.update_sites = head_on_device(layout)}},
      {"layup, head and block 0 on the device, speculative",
       "layup",
       {.speculative_clip = true, .update_sites = head_and_block_0}},
      {"layup, head and block 0 on the device, deferred",
       "layup",
       {.update_sites = head_and_block_0}},
      // ZeRO-1: each rank updates its part of every span, which starts an 8-bit block of it.
      {"gpu, ZeRO-1", "gpu", {.optimizer_shards = ranks}},
      {"gpu, ZeRO-1, bf16 state",
       "gpu",
       {.optimizer_shards = ranks, .optimizer_state = OptimizerStateKind::kBf16}},
      {"gpu, ZeRO-1, 8-bit state",
       "gpu",
       {.optimizer_shards = ranks, .optimizer_state = OptimizerStateKind::kBlockwise8Bit}},
      // ZeRO-1 of layup's device-updated spans, beside host-updated blocks or for every span.
      {"layup, head on the device, ZeRO-1",
       "layup",
       {.update_sites = head_on_device(layout), .optimizer_shards = ranks}},
      {"layup, head and block 0 on the device, ZeRO-1, speculative, bf16 state",
       "layup",
       {.speculative_clip = true,
        .update_sites = head_and_block_0,
        .optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBf16}},
      {"layup, every span on the device, ZeRO-1, 8-bit state",
       "layup",
       {.update_sites = every_span_on_device,
        .optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBlockwise8Bit}},
      // ZeRO-1 of the host's state: each rank's CPU updates its part of every host span.
      {"offload, ZeRO-1", "offload", {.optimizer_shards = ranks}},
      {"offload, ZeRO-1, 2 micro-batches a rank", "offload", {.optimizer_shards = ranks}, 2},
      {"offload, ZeRO-1, 8-bit state",
       "offload",
       {.optimizer_shards = ranks, .optimizer_state = OptimizerStateKind::kBlockwise8Bit}},
      {"layup, ZeRO-1", "layup", {.optimizer_shards = ranks}},
      {"layup, ZeRO-1, 2 micro-batches a rank", "layup", {.optimizer_shards = ranks}, 2},
      {"layup, ZeRO-1, speculative asked (deferred), bf16 state, weights in place",
       "layup",
       {.weights_in_place = true,
        .speculative_clip = true,
        .optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBf16}},
      {"layup, head on the device, host blocks and device head ZeRO-1, 2 micro-batches a rank",
       "layup",
       {.update_sites = head_on_device(layout), .optimizer_shards = ranks},
       2},
      // Layer-major accumulation: each rank sums its micro-batches span by span, then the ranks'
      // sums (the host-updated spans' in the host's gradient, the device-updated ones' where they
      // lie), against micro-batch-major with every rank keeping the whole state.
      {"offload, layer-major, 2 micro-batches a rank",
       "offload",
       {.accumulation = Accumulation::kLayerMajor},
       2},
      {"layup, layer-major, ZeRO-1, 2 micro-batches a rank",
       "layup",
       {.optimizer_shards = ranks, .accumulation = Accumulation::kLayerMajor},
       2},
      {"layup, layer-major, head and block 0 on the device, 2 micro-batches a rank",
       "layup",
       {.update_sites = head_and_block_0, .accumulation = Accumulation::kLayerMajor},
       2},
      {"layup, layer-major, every span on the device, ZeRO-1, 8-bit state, 2 micro-batches a "
       "rank",
       "layup",
       {.update_sites = every_span_on_device,
        .optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBlockwise8Bit,
        .accumulation = Accumulation::kLayerMajor},
       2},
      {"layup, layer-major, ZeRO-1, one micro-batch a rank",
       "layup",
       {.optimizer_shards = ranks, .accumulation = Accumulation::kLayerMajor}},
      // Streamed blocks: each rank's ring fills from the weights its updates (ZeRO-1: the
      // gathers) wrote.
      {"offload, 3 blocks streamed", "offload", {.streamed_blocks = 3}},
      {"layup, ZeRO-1, 3 blocks streamed, 2 micro-batches a rank",
       "layup",
       {.optimizer_shards = ranks, .streamed_blocks = 3},
       2},
      {"layup, head on the device, 1 block streamed",
       "layup",
       {.update_sites = head_on_device(layout), .streamed_blocks = 1}},
      {"layup, layer-major, ZeRO-1, bf16 state, 3 blocks streamed, 2 micro-batches a rank",
       "layup",
       {.optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBf16,
        .accumulation = Accumulation::kLayerMajor,
        .streamed_blocks = 3},
       2},
      // Blocks staged through the device, as several GPUs run them (every rank keeps the whole
      // state: ZeRO-1 keeps parts, which a staged update cannot read).
      {"layup, blocks 0 and 2 staged", "layup", {.update_sites = staged_0_and_2(layout)}},
      {"offload, blocks 0 and 2 staged, layer-major, 2 micro-batches a rank",
       "offload",
       {.update_sites = staged_0_and_2(layout), .accumulation = Accumulation::kLayerMajor},
       2},
      {"layup, blocks 0 and 2 staged beside a device head, 1 block streamed",
       "layup",
       {.update_sites = staged_0_and_2(layout, head_on_device(layout)), .streamed_blocks = 1}},
      // Blocks of two sum-of-squares chunks: the shards cut inside a span.
      {"layup, ZeRO-1, blocks cut between ranks",
       "layup",
       {.optimizer_shards = ranks},
       1,
       gpt2_config(2, 2, 128, 16, 61)},
  };
  const ClipPlan clip_plan = [](int step, std::span<const TokenBatch>) {
    return step % 3 == 2 ? 0.0f : step % 3 == 0 ? 1e-3f : 1e6f;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ScheduleOptions alone = c.options;
    alone.optimizer_shards = 1;
    const int per_rank = c.micro_batches_per_rank;
    const Share share = {world->rank() * per_rank, per_rank, false};
    ScheduleOptions ranked = c.options;
    ranked.ranks = world.get();
    // Several micro-batches a rank add in another order than one process's (each rank's sum,
    // then the ranks'): those runs are compared with the same ranks keeping the whole state and
    // summing micro-batch by micro-batch (which one rank's layer-major sums equal bit for bit).
    ScheduleOptions whole = ranked;
    whole.optimizer_shards = 1;
    whole.accumulation = Accumulation::kMicroBatchMajor;
    const TrainingRun one =
        per_rank == 1
            ? train(with_options(c.mode, alone), ranks, clip_plan, c.config)
            : train(with_options(c.mode, whole), ranks * per_rank, clip_plan, c.config, share);
    const bool sharded = c.options.optimizer_shards > 1;
    TrainingRun mine = train(with_options(c.mode, ranked), ranks * per_rank, clip_plan, c.config,
                             {share.first, share.taken, sharded});
    EXPECT_NE(one.losses.front(), one.losses.back());
    if (sharded && world->rank() > 0) mine.tensors = one.tensors;  // rank 0 has compared them
    expect_same(one, mine, c.name);
  }
}

// ZeRO-1 with blocks whose state is on disk (mpirun, as the case above): each rank's disk tier has
// a file of its own (here in a folder of its own) holding its blocks' whole master weights and
// its part of their moments, updated after the norm in layout order, read ahead in that order.
// layup ends bitwise like one process taking every micro-batch, in fp32 and 8-bit state, with one
// staging slot (every update reads its block again) and with as many as blocks, beside device-
// and host-updated spans, with blocks cut between ranks; rank 0's export asks the other ranks for
// the parts of their disk blocks' moments. With two micro-batches a rank (another order of
// additions than one process's), like the same ranks keeping the whole state on the host.
TEST(RanksEquivalence, BlocksOnDiskTrainLikeOneProcess) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  if (world->size() < 2)
    GTEST_SKIP() << "one process: mpirun -np 2 runs this (test_data_parallel.py)";
  const int ranks = world->size();
  test_files::TempDir dir;  // this rank's
  const ParameterLayout layout(tiny_config());
  const size_t spans = layout.spans().size();
  std::vector<UpdateSite> blocks_1_and_2(spans, UpdateSite::kHost);
  blocks_1_and_2[1 + 1] = blocks_1_and_2[1 + 2] = UpdateSite::kDisk;
  std::vector<UpdateSite> every_block(spans, UpdateSite::kDisk);
  every_block.front() = every_block.back() = UpdateSite::kHost;
  // Blocks of four sum-of-squares chunks, which two and three ranks both cut inside a block.
  const ModelConfig wide_blocks = gpt2_config(2, 2, 128, 16, 61);
  std::vector<UpdateSite> wide_on_disk(ParameterLayout(wide_blocks).spans().size(),
                                       UpdateSite::kDisk);
  wide_on_disk.front() = wide_on_disk.back() = UpdateSite::kHost;
  struct Case {
    std::string name;
    ScheduleOptions options;
    int micro_batches_per_rank = 1;
    ModelConfig config = tiny_config();
  };
  const ScheduleOptions on_disk = {.update_sites = blocks_1_and_2,
                                   .offload_dir = dir.path(),
                                   .disk_slots = 1,
                                   .optimizer_shards = ranks};
  ScheduleOptions on_disk_8bit = on_disk;
  on_disk_8bit.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  std::vector<Case> cases = {
      {"blocks 1-2 on disk, 1 slot", on_disk},
      {"blocks 1-2 on disk, 1 slot, 8-bit state", on_disk_8bit},
      {"blocks 1-2 on disk, 1 slot, 2 micro-batches a rank", on_disk, 2},
      {"blocks 1-2 on disk, 1 slot, 8-bit state, 2 micro-batches a rank", on_disk_8bit, 2},
      {"every block on disk, 3 slots, master weights in place",
       {.weights_in_place = true,
        .update_sites = every_block,
        .offload_dir = dir.path(),
        .disk_slots = 3,
        .optimizer_shards = ranks}},
      {"blocks 0 and 2 on disk, block 1 and the head on the device",
       {.update_sites = disk_device_disk(layout),
        .offload_dir = dir.path(),
        .disk_slots = 1,
        .optimizer_shards = ranks}},
      {"every block on disk, cut between ranks, 8-bit state",
       {.update_sites = wide_on_disk,
        .offload_dir = dir.path(),
        .disk_slots = 1,
        .optimizer_shards = ranks,
        .optimizer_state = OptimizerStateKind::kBlockwise8Bit},
       1,
       wide_blocks},
  };
  const ClipPlan clip_plan = [](int step, std::span<const TokenBatch>) {
    return step % 3 == 2 ? 0.0f : step % 3 == 0 ? 1e-3f : 1e6f;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int per_rank = c.micro_batches_per_rank;
    const Share share = {world->rank() * per_rank, per_rank, false};
    ScheduleOptions ranked = c.options;
    ranked.ranks = world.get();
    TrainingRun one;
    if (per_rank == 1) {
      ScheduleOptions alone = c.options;
      alone.optimizer_shards = 1;
      one = train(with_options("layup", alone), ranks, clip_plan, c.config);
    } else {
      // Each rank's sum of its micro-batches, then the ranks': compared with the same ranks
      // keeping the whole state on the host.
      ScheduleOptions whole = ranked;
      whole.optimizer_shards = 1;
      for (UpdateSite& site : whole.update_sites)
        if (site == UpdateSite::kDisk) site = UpdateSite::kHost;
      one = train(with_options("layup", whole), ranks * per_rank, clip_plan, c.config, share);
    }
    TrainingRun mine = train(with_options("layup", ranked), ranks * per_rank, clip_plan, c.config,
                             {share.first, share.taken, true});
    EXPECT_NE(one.losses.front(), one.losses.back());
    if (world->rank() > 0) mine.tensors = one.tensors;  // rank 0 has compared them
    expect_same(one, mine, c.name);
  }
  // What each rank's tier keeps, and its file's name.
  const ParameterLayout tiny(tiny_config());
  ScheduleOptions ranked = on_disk;
  ranked.ranks = world.get();
  const std::unique_ptr<Schedule> schedule = with_options("layup", ranked)(
      make_cpu_backend(tiny_config(), kBatch, kSeqLen), make_cpu_device(), tiny);
  const std::string storage = schedule->storage_report();
  EXPECT_NE(storage.find("this rank's part of their moments"), std::string::npos) << storage;
  EXPECT_NE(storage.find("rank" + std::to_string(world->rank()) + "-"), std::string::npos)
      << storage;
}

}  // namespace
}  // namespace layup
