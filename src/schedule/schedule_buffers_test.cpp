// Each schedule allocates exactly what schedule_buffers lists: after building it and running a
// step, every cell of the accountant equals the list's sum there, for every mode and the layup
// policies' combinations (host gradient or not, speculative, spans updated on the device).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "schedule/random_step.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

struct Case {
  std::string name;
  Mode mode;
  ScheduleOptions options;
  bool clip = true;  // steps without a host gradient must not clip or accumulate
};

std::vector<UpdateSite> block_1_and_head(const ParameterLayout& layout) {
  std::vector<UpdateSite> sites = head_on_device(layout);
  sites[2] = UpdateSite::kDevice;  // block 1
  return sites;
}

TEST(ScheduleBuffers, EveryCellTheAccountantMeasuresIsListed) {
  const ModelConfig config = gpt2_config(3, 2, 32, 16, 61);
  const ParameterLayout layout(config);
  constexpr int kBatch = 2, kSeqLen = 8;
  const std::vector<Case> cases = {
      {"gpu", Mode::kGpu, {}},
      {"offload in place", Mode::kOffload, {.cpu_workers = 1, .weights_in_place = true}},
      {"offload with a device copy", Mode::kOffload, {.cpu_workers = 1}},
      {"layup deferred", Mode::kLayup, {.cpu_workers = 1, .weights_in_place = true}},
      {"layup slots only",
       Mode::kLayup,
       {.cpu_workers = 1, .weights_in_place = true, .host_gradient = false},
       false},
      {"layup speculative", Mode::kLayup, {.cpu_workers = 1, .speculative_clip = true}},
      {"layup head on the device",
       Mode::kLayup,
       {.cpu_workers = 1, .update_sites = head_on_device(layout)}},
      {"layup block 1 and the head on the device, speculative",
       Mode::kLayup,
       {.cpu_workers = 1, .speculative_clip = true, .update_sites = block_1_and_head(layout)}},
      {"layup block 1 and the head on the device, slots only",
       Mode::kLayup,
       {.cpu_workers = 1, .host_gradient = false, .update_sites = block_1_and_head(layout)},
       false},
  };
  for (const Case& c : cases) {
    for (int micro_batches : {1, 2}) {
      if (!c.clip && micro_batches > 1) continue;
      SCOPED_TRACE(c.name + " x" + std::to_string(micro_batches));
      auto accountant = std::make_shared<MemoryAccountant>();
      std::unique_ptr<Device> device = make_cpu_device(accountant);
      const BufferList listed =
          schedule_buffers(c.mode, layout, c.options, device->kinds(), micro_batches);
      // The backend records into a ledger of its own: this test is about the schedule's buffers.
      std::unique_ptr<Schedule> schedule = make_schedule(
          c.mode, make_cpu_backend(config, kBatch, kSeqLen), std::move(device), layout, c.options);
      schedule->import_tensors(fresh_optimizer_tensors(layout, 7));

      ASSERT_TRUE(
          random_step(*schedule, config, kBatch, kSeqLen, micro_batches, c.clip ? 1.0f : 0.0f)
              .applied);

      for (MemorySide side : kAllMemorySides)
        for (TensorClass tensor_class : kAllTensorClasses)
          for (MemoryKind kind : kAllMemoryKinds) {
            size_t bytes = 0;
            for (const PlannedAllocation& buffer : listed)
              if (buffer.side == side && buffer.tensor_class == tensor_class && buffer.kind == kind)
                bytes += buffer.bytes;
            const MemoryUsage measured = accountant->cell(side, tensor_class, kind);
            EXPECT_EQ(measured.peak, bytes)
                << memory_side_name(side) << " " << tensor_class_label(tensor_class) << " "
                << memory_kind_name(kind);
            EXPECT_EQ(measured.current, bytes);
          }
      EXPECT_GT(accountant->total().peak, 0u);
    }
  }
}

// gpu's plan updates every span on the device: its buffers are one fp32 copy of the weights (the
// master weights), the whole-model gradient (and with several micro-batches its sum), the moments,
// and on the host nothing but the device's sums of squares.
TEST(ScheduleBuffers, GpuModeKeepsOneCopyOfTheWeightsAndNoHostState) {
  const ParameterLayout layout(gpt2_config(3, 2, 32, 16, 61));
  const size_t n = layout.total_count() * sizeof(float);
  for (int micro_batches : {1, 2}) {
    SCOPED_TRACE(micro_batches);
    size_t device = 0, weights = 0, grads = 0, moments = 0;
    for (const PlannedAllocation& buffer :
         schedule_buffers(Mode::kGpu, layout, {}, make_cpu_device()->kinds(), micro_batches)) {
      if (buffer.side == MemorySide::kHost) {
        EXPECT_EQ(buffer.tensor_class, TensorClass::kScratch) << buffer.what;
        continue;
      }
      device += buffer.bytes;
      EXPECT_NE(buffer.tensor_class, TensorClass::kWeights) << buffer.what;
      weights += buffer.tensor_class == TensorClass::kMasterWeights ? buffer.bytes : 0;
      grads += buffer.tensor_class == TensorClass::kWeightGrads ? buffer.bytes : 0;
      moments += buffer.tensor_class == TensorClass::kOptimizerMoments ? buffer.bytes : 0;
    }
    EXPECT_EQ(weights, n);
    EXPECT_EQ(grads, n * static_cast<size_t>(micro_batches));
    EXPECT_EQ(moments, 2 * n);
    EXPECT_EQ(device, weights + grads + moments);
  }
}

// ZeRO-1 of the host's state (a plan, before the rank is known): offload's and layup's host
// moments are the largest rank's part, at least 1/N of the whole and less than it, and speculative
// clipping keeps no spare copy (it runs deferred).
TEST(ScheduleBuffers, ZeroOneListsTheLargestShardOfTheHostMoments) {
  const ParameterLayout layout(gpt2_config(2, 2, 80, 16, 61));  // blocks of two chunks
  const size_t whole = 2 * layout.total_count() * sizeof(float);
  for (const Mode mode : {Mode::kOffload, Mode::kLayup}) {
    for (int shards : {2, 3}) {
      SCOPED_TRACE(name_of(mode) + " over " + std::to_string(shards));
      size_t moments = 0;
      int listed = 0;
      for (const PlannedAllocation& buffer :
           schedule_buffers(mode, layout, {.speculative_clip = true, .optimizer_shards = shards},
                            make_cpu_device()->kinds(), 1)) {
        if (buffer.tensor_class != TensorClass::kOptimizerMoments) continue;
        moments += buffer.bytes;
        listed += 1;
        EXPECT_NE(buffer.what.find("this rank's shard of " + std::to_string(shards)),
                  std::string::npos)
            << buffer.what;
      }
      EXPECT_EQ(listed, 1);
      EXPECT_GE(moments * static_cast<size_t>(shards), whole);
      EXPECT_LT(moments, whole);
    }
  }
}

}  // namespace
}  // namespace layup
