// The step plans the modes compile to: which tasks, on which lanes, in which order, after what.
#include "schedule/step_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace layup {
namespace {

const ParameterLayout& layout() {
  static const ParameterLayout tiny(gpt2_config(4, 2, 64, 64));  // 6 spans
  return tiny;
}

constexpr DeviceKinds kKinds{MemoryKind::kDevice, MemoryKind::kPinnedMapped};

StepPlan plan_of(Mode mode, int micro_batches = 1, bool clipping = false,
                 std::vector<UpdateSite> sites = {},
                 Accumulation accumulation = Accumulation::kMicroBatchMajor) {
  ScheduleOptions options;
  options.update_sites = std::move(sites);
  options.accumulation = accumulation;
  return compile_step_plan(mode, layout(), options, kKinds, micro_batches, clipping);
}

// The index of the first task of `kind` of `span` (micro-batch `k`, or any).
int find(const StepPlan& plan, TaskKind kind, int span, int k = -2) {
  for (size_t t = 0; t < plan.tasks.size(); ++t) {
    const PlanTask& task = plan.tasks[t];
    if (task.kind == kind && task.span == span && (k == -2 || task.micro_batch == k))
      return static_cast<int>(t);
  }
  return -1;
}

bool waits_for(const StepPlan& plan, int task, int before) {
  const std::vector<int>& after = plan.tasks[task].after;
  return std::find(after.begin(), after.end(), before) != after.end();
}

TEST(StepPlan, EveryTaskWaitsOnlyForEarlierOnesInEveryModeAndPlacement) {
  const std::vector<std::vector<UpdateSite>> placements = {
      {},
      {UpdateSite::kDevice, UpdateSite::kHost, UpdateSite::kHost, UpdateSite::kHost,
       UpdateSite::kHost, UpdateSite::kDevice},
      {UpdateSite::kHost, UpdateSite::kDisk, UpdateSite::kDevice, UpdateSite::kDisk,
       UpdateSite::kDisk, UpdateSite::kHost},
      {UpdateSite::kDevice, UpdateSite::kStaged, UpdateSite::kDevice, UpdateSite::kStaged,
       UpdateSite::kStaged, UpdateSite::kHost}};
  for (const Mode mode : {Mode::kGpu, Mode::kOffload, Mode::kLayup})
    for (const int micro_batches : {1, 3})
      for (const bool clipping : {false, true})
        for (const auto& sites : placements)
          for (const Accumulation accumulation :
               {Accumulation::kMicroBatchMajor, Accumulation::kLayerMajor}) {
            const StepPlan plan = plan_of(mode, micro_batches, clipping, sites, accumulation);
            for (size_t t = 0; t < plan.tasks.size(); ++t) {
              for (const int before : plan.tasks[t].after) EXPECT_LT(before, static_cast<int>(t));
              for (const int before : plan.tasks[t].after_last_step)
                EXPECT_LT(before, static_cast<int>(plan.tasks.size()));
            }
            EXPECT_EQ(plan.count(TaskKind::kNorm, Lane::kStep), 1);
            // Every span is updated once a step, and computed forward and backward per micro-batch.
            for (int span = 0; span < 6; ++span) {
              int updates = 0, forwards = 0, backwards = 0;
              for (const PlanTask& task : plan.tasks) {
                if (task.span != span) continue;
                updates += task.kind == TaskKind::kAdamW;
                forwards += task.kind == TaskKind::kForward;
                backwards += task.kind == TaskKind::kBackward;
              }
              EXPECT_EQ(updates, 1) << name_of(mode) << " span " << span;
              EXPECT_EQ(forwards, micro_batches);
              EXPECT_EQ(backwards, micro_batches);
            }
          }
}

// Layer-major (three micro-batches): the forward span by span, each span's of every micro-batch
// in turn (embeddings, blocks 0..3), then each micro-batch's final norm (its loss) and head
// backward; then each block's backward of every micro-batch in turn, each added into its sum on
// the device, the sum copied to the host once, the slot's first user waiting for the copy two
// blocks above; the embeddings' backwards last. The host sums only the head's micro-batches, as
// micro-batch-major does. Across steps each span's first forward waits for that span's update
// alone (its new weights landed). gpu mode and one micro-batch ignore it.
TEST(StepPlan, LayerMajorSumsEachBlockOnTheDeviceAndCopiesItOnce) {
  const StepPlan plan = plan_of(Mode::kLayup, 3, false, {}, Accumulation::kLayerMajor);
  // The forward's order on the device lane.
  std::vector<std::pair<int, int>> forwards, expected;  // (span, micro-batch)
  for (const PlanTask& task : plan.tasks)
    if (task.kind == TaskKind::kForward) forwards.emplace_back(task.span, task.micro_batch);
  for (int span = 0; span < 5; ++span)
    for (int k = 0; k < 3; ++k) expected.emplace_back(span, k);
  for (int k = 0; k < 3; ++k) expected.emplace_back(5, k);
  EXPECT_EQ(forwards, expected);
  for (int k = 0; k < 3; ++k) {
    const int head = find(plan, TaskKind::kBackward, 5, k);
    EXPECT_GT(head, find(plan, TaskKind::kForward, 5, k));
    if (k < 2) {
      EXPECT_LT(head, find(plan, TaskKind::kForward, 5, k + 1));
    }
  }
  for (int span = 0; span < 6; ++span) {
    const std::vector<int>& last_step =
        plan.tasks[find(plan, TaskKind::kForward, span, 0)].after_last_step;
    EXPECT_NE(
        std::find(last_step.begin(), last_step.end(), find(plan, TaskKind::kWeightsToDevice, span)),
        last_step.end())
        << "span " << span;
    for (int other = 1; other < 5; ++other) {
      if (other != span) {
        EXPECT_EQ(std::find(last_step.begin(), last_step.end(),
                            find(plan, TaskKind::kWeightsToDevice, other)),
                  last_step.end())
            << "span " << span << " waits for block " << other - 1 << "'s update";
      }
    }
  }
  EXPECT_EQ(plan.accumulation, Accumulation::kLayerMajor);
  EXPECT_EQ(plan.count(TaskKind::kAddGradient, Lane::kCpu), 2 * 2);  // the head's, after k = 0
  EXPECT_EQ(plan.count(TaskKind::kGradientToHost, Lane::kToHost), 4 + 2 * 3);
  // The first micro-batch's block gradient is written into the slot, the later ones added.
  EXPECT_EQ(plan.count(TaskKind::kAddGradient, Lane::kDevice), 4 * 2);
  const int last_forward = find(plan, TaskKind::kForward, 5, 2);
  for (int span = 1; span <= 4; ++span) {
    const int copy = find(plan, TaskKind::kGradientToHost, span);
    EXPECT_EQ(plan.tasks[copy].micro_batch, -1);
    for (int k = 0; k < 3; ++k) {
      const int backward = find(plan, TaskKind::kBackward, span, k);
      EXPECT_GT(backward, last_forward) << "block " << span - 1;
      EXPECT_LT(backward, copy);
      if (span < 4) {
        EXPECT_GT(backward, find(plan, TaskKind::kBackward, span + 1, 2));
      }
    }
    EXPECT_TRUE(waits_for(plan, copy, find(plan, TaskKind::kAddGradient, span, 2)));
    if (span <= 2) {
      EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kBackward, span, 0),
                            find(plan, TaskKind::kGradientToHost, span + 2)));
    }
    if (span <= 3) {  // the later micro-batches take the other slot, the block above's
      EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kBackward, span, 1),
                            find(plan, TaskKind::kGradientToHost, span + 1)));
    }
  }
  EXPECT_GT(find(plan, TaskKind::kBackward, 0, 0), find(plan, TaskKind::kBackward, 1, 2));
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kGradientToHost, 0, 2),
                        find(plan, TaskKind::kBackward, 0, 2)));
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kBackward, 5, 1),
                        find(plan, TaskKind::kGradientToHost, 5, 0)))
      << "backward_head overwrites the final norm's gradient the host takes";
  EXPECT_EQ(plan_of(Mode::kGpu, 3, false, {}, Accumulation::kLayerMajor).accumulation,
            Accumulation::kMicroBatchMajor);
  EXPECT_EQ(plan_of(Mode::kLayup, 1, false, {}, Accumulation::kLayerMajor).accumulation,
            Accumulation::kMicroBatchMajor);
}

TEST(StepPlan, GpuModeRunsEverythingOnTheDevice) {
  for (const int micro_batches : {1, 2})
    for (const bool clipping : {false, true}) {
      const StepPlan plan = plan_of(Mode::kGpu, micro_batches, clipping);
      for (const PlanTask& task : plan.tasks)
        EXPECT_TRUE(task.lane == Lane::kDevice || task.lane == Lane::kStep) << plan.task_name(task);
      for (const SpanPlan& span : plan.spans) {
        EXPECT_EQ(span.site, UpdateSite::kDevice);
        EXPECT_EQ(span.gradient, GradientTarget::kWholeGradient);
      }
      EXPECT_FALSE(plan.host_gradient);
      EXPECT_EQ(plan.window, UpdateWindow::kAfterNorm);
    }
  const StepPlan plan = plan_of(Mode::kGpu, 2);
  // Both micro-batches summed from +0.
  EXPECT_EQ(plan.count(TaskKind::kAddGradient, Lane::kDevice), 12);
  EXPECT_EQ(plan.count(TaskKind::kAdamW, Lane::kDevice), 6);
  // The first forward of a step waits for the last step's update of its span.
  const int forward = find(plan, TaskKind::kForward, 2, 0);
  EXPECT_EQ(plan.tasks[forward].after_last_step, std::vector<int>{find(plan, TaskKind::kAdamW, 2)});
}

// Several ranks: every span's gradient is summed over them once a step, on the ranks' lane. A
// device-updated span's sum waits for its last micro-batch's backward or add and nothing else, so
// it comes before the backward of the block below (which the device computes meanwhile); the norm
// waits for every sum, and each device AdamW for its own span's.
TEST(StepPlan, EachDeviceUpdatedSpanIsSummedOverTheRanksAsItsGradientIsFinal) {
  const std::vector<std::pair<Mode, std::vector<UpdateSite>>> runs = {
      {Mode::kGpu, {}},
      {Mode::kOffload, {}},
      {Mode::kLayup, {}},
      {Mode::kLayup,
       {UpdateSite::kDevice, UpdateSite::kDevice, UpdateSite::kHost, UpdateSite::kHost,
        UpdateSite::kHost, UpdateSite::kDevice}},
      {Mode::kLayup, std::vector<UpdateSite>(6, UpdateSite::kDevice)}};
  for (const auto& [mode, sites] : runs)
    for (const int micro_batches : {1, 2})
      for (const bool clipping : {false, true}) {
        SCOPED_TRACE(name_of(mode) + " x" + std::to_string(micro_batches) +
                     (clipping ? " clipped" : "") + (sites.empty() ? "" : " with device spans"));
        ScheduleOptions options;
        options.update_sites = sites;
        options.planned_ranks = 2;
        const StepPlan plan =
            compile_step_plan(mode, layout(), options, kKinds, micro_batches, clipping);
        EXPECT_EQ(plan.ranks, 2);
        for (size_t t = 0; t < plan.tasks.size(); ++t)
          for (const int before : plan.tasks[t].after) EXPECT_LT(before, static_cast<int>(t));
        const int last_k = micro_batches - 1;
        const int norm = find(plan, TaskKind::kNorm, -1);
        for (int span = 0; span < 6; ++span) {
          int sums = 0;
          for (const PlanTask& task : plan.tasks)
            if (task.span == span && task.kind == TaskKind::kSumOverRanks) {
              ++sums;
              EXPECT_EQ(task.lane, Lane::kRanks);
            }
          EXPECT_EQ(sums, 1) << "span " << span;
          const int sum = find(plan, TaskKind::kSumOverRanks, span);
          if (plan.spans[span].site != UpdateSite::kDevice) {
            EXPECT_TRUE(waits_for(plan, norm, sum)) << "span " << span;
            continue;
          }
          // Its gradient is final after its last micro-batch's add, where the device adds;
          // else after its backward (a head span's: backward_embeddings, which ends both).
          const bool head = span == 0 || span == 5;
          int final = find(plan, TaskKind::kAddGradient, span, last_k);
          if (final < 0) final = find(plan, TaskKind::kBackward, head ? 0 : span, last_k);
          EXPECT_EQ(plan.tasks[sum].after, std::vector<int>{final}) << "span " << span;
          if (!head && span > 1) {
            EXPECT_LT(sum, find(plan, TaskKind::kBackward, span - 1, last_k))
                << "block " << span - 2 << "'s backward comes before block " << span - 1
                << "'s sum";
          }
          EXPECT_TRUE(waits_for(plan, norm, sum)) << "span " << span;
          EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kAdamW, span), sum)) << "span " << span;
        }
        // The lane's device-updated spans in the order their gradients are final: the blocks
        // top down, then the embeddings and the final norm.
        std::vector<int> lane, expected;
        for (const PlanTask& task : plan.tasks)
          if (task.lane == Lane::kRanks && plan.spans[task.span].site == UpdateSite::kDevice)
            lane.push_back(task.span);
        for (const int span : {4, 3, 2, 1, 0, 5})
          if (plan.spans[span].site == UpdateSite::kDevice) expected.push_back(span);
        EXPECT_EQ(lane, expected);
      }
  // One rank sums nothing.
  EXPECT_EQ(plan_of(Mode::kGpu, 2).count(TaskKind::kSumOverRanks, Lane::kRanks), 0);
  EXPECT_EQ(plan_of(Mode::kLayup, 2, true).count(TaskKind::kSumOverRanks, Lane::kRanks), 0);
}

TEST(StepPlan, LayupWithoutClippingUpdatesEachBlockAsItsGradientLands) {
  const StepPlan plan = plan_of(Mode::kLayup);
  EXPECT_EQ(plan.window, UpdateWindow::kDuringBackward);
  const int norm = find(plan, TaskKind::kNorm, -1);
  for (int layer = 0; layer < 4; ++layer) {
    const int span = 1 + layer;
    EXPECT_EQ(plan.spans[span].gradient, GradientTarget::kSlot);
    const int copy = find(plan, TaskKind::kGradientToHost, span);
    const int adamw = find(plan, TaskKind::kAdamW, span);
    EXPECT_TRUE(waits_for(plan, adamw, copy));
    EXPECT_LT(adamw, norm) << "block " << layer << " waited for the norm";
    EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kWeightsToDevice, span), adamw));
  }
  // Two slots: block 1's backward waits until the host has block 3's gradient (the same slot).
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kBackward, 2),
                        find(plan, TaskKind::kGradientToHost, 4)));
  // The head is updated once the norm is known.
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kAdamW, 0), norm));
}

TEST(StepPlan, LayupWithClippingDefersTheUpdatesAfterTheNormTheHeadsFirstThenForwardOrder) {
  const StepPlan plan = plan_of(Mode::kLayup, 1, /*clipping=*/true);
  EXPECT_EQ(plan.window, UpdateWindow::kAfterNorm);
  const int norm = find(plan, TaskKind::kNorm, -1);
  int previous = norm;
  for (const int span : {0, 5, 1, 2, 3, 4}) {
    const int adamw = find(plan, TaskKind::kAdamW, span);
    EXPECT_TRUE(waits_for(plan, adamw, norm));
    EXPECT_GT(adamw, previous);
    previous = adamw;
  }
}

TEST(StepPlan, OffloadCopiesAfterBackwardAndNothingOverlaps) {
  const StepPlan plan = plan_of(Mode::kOffload, 2);
  const int backward_done = find(plan, TaskKind::kBackward, 0, 0);
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kGradientToHost, 0, 0), backward_done));
  // The second micro-batch starts once the first's last copy (the head's go first, then the
  // blocks' in forward order: the last block's) is on the host.
  EXPECT_TRUE(waits_for(plan, find(plan, TaskKind::kForward, 0, 1),
                        find(plan, TaskKind::kGradientToHost, 4, 0)));
  EXPECT_EQ(plan.count(TaskKind::kAddGradient, Lane::kCpu), 6);
  // Its step returns once every span's weights have landed: the next step's first forward
  // waits for all of them.
  EXPECT_EQ(plan.tasks[find(plan, TaskKind::kForward, 0, 0)].after_last_step.size(), 7u);
}

TEST(StepPlan, DiskReadsRunAheadByTheStagingSlots) {
  ScheduleOptions options;
  options.update_sites = {UpdateSite::kHost, UpdateSite::kDisk, UpdateSite::kDisk,
                          UpdateSite::kDisk, UpdateSite::kDisk, UpdateSite::kHost};
  options.disk_slots = 2;
  const StepPlan plan = compile_step_plan(Mode::kLayup, layout(), options, kKinds, 1, true);
  // After the norm the disk blocks go bottom up: blocks 0 and 1 are read at once, block 2 once
  // block 0's state is written back (its slot free).
  EXPECT_TRUE(plan.tasks[find(plan, TaskKind::kReadState, 1)].after.empty());
  EXPECT_TRUE(plan.tasks[find(plan, TaskKind::kReadState, 2)].after.empty());
  EXPECT_TRUE(
      waits_for(plan, find(plan, TaskKind::kReadState, 3), find(plan, TaskKind::kWriteState, 1)));
  EXPECT_TRUE(
      waits_for(plan, find(plan, TaskKind::kAdamW, 3), find(plan, TaskKind::kReadState, 3)));
}

// Staged blocks (UpdateSite::kStaged): each update's gradient and state go into a slot on the
// device over the link up, the staging lane issues the device's AdamW once they are in, the state
// goes back down, and the block counts as landed (the next forward's wait) once it is back. The
// third staged update's copies in take the first's slot once its state is back (two slots),
// first in a step the slot the step before's last updates free; gpu mode and offload with no
// staged block have no staging lane, and offload's staged blocks take the same tasks.
TEST(StepPlan, StagedBlocksGoThroughTheirSlotsOnTheLinks) {
  ScheduleOptions options;
  options.update_sites = {UpdateSite::kHost,   UpdateSite::kStaged, UpdateSite::kHost,
                          UpdateSite::kStaged, UpdateSite::kStaged, UpdateSite::kHost};
  for (const Mode mode : {Mode::kLayup, Mode::kOffload}) {
    SCOPED_TRACE(name_of(mode));
    const StepPlan plan = compile_step_plan(mode, layout(), options, kKinds, 2, true);
    EXPECT_EQ(plan.staging_slots, 2);
    EXPECT_EQ(plan.count(TaskKind::kAdamW, Lane::kStaging), 3);
    EXPECT_EQ(plan.count(TaskKind::kAdamW, Lane::kCpu), 3);  // the head and block 1
    EXPECT_EQ(plan.count(TaskKind::kReadState, Lane::kToDevice), 3);
    EXPECT_EQ(plan.count(TaskKind::kWriteState, Lane::kToHost), 3);
    EXPECT_EQ(plan.count(TaskKind::kWeightsToDevice, Lane::kToDevice), 3);  // none of a staged one
    const int norm = find(plan, TaskKind::kNorm, -1);
    for (const int span : {1, 3, 4}) {
      const int read = find(plan, TaskKind::kReadState, span);
      const int adamw = find(plan, TaskKind::kAdamW, span);
      const int written = find(plan, TaskKind::kWriteState, span);
      EXPECT_EQ(plan.tasks[read].lane, Lane::kToDevice);
      EXPECT_TRUE(waits_for(plan, read, norm));
      EXPECT_TRUE(waits_for(plan, adamw, read));
      EXPECT_TRUE(waits_for(plan, written, adamw));
      // The next step's first forward of the block (offload: the whole forward) waits for its
      // state back.
      const int forward = find(plan, TaskKind::kForward, mode == Mode::kOffload ? 0 : span, 0);
      const std::vector<int>& last_step = plan.tasks[forward].after_last_step;
      EXPECT_NE(std::find(last_step.begin(), last_step.end(), written), last_step.end());
    }
    // Forward order after the norm: blocks 0, 2, 3 staged; block 3's copies in wait for block 0's
    // state to be back; block 0's and block 2's, first in the step, for the step before's.
    EXPECT_TRUE(
        waits_for(plan, find(plan, TaskKind::kReadState, 4), find(plan, TaskKind::kWriteState, 1)));
    const std::vector<int>& first = plan.tasks[find(plan, TaskKind::kReadState, 1)].after_last_step;
    EXPECT_EQ(first, std::vector<int>{find(plan, TaskKind::kWriteState, 3)});
    EXPECT_NE(plan.describe().find("staging"), std::string::npos) << plan.describe();
  }
  // Without clipping layup updates the staged blocks as their gradients land, top down.
  const StepPlan during = compile_step_plan(Mode::kLayup, layout(), options, kKinds, 1, false);
  EXPECT_LT(find(during, TaskKind::kAdamW, 4), find(during, TaskKind::kBackward, 3));
  EXPECT_TRUE(waits_for(during, find(during, TaskKind::kReadState, 4),
                        find(during, TaskKind::kGradientToHost, 4)));
  EXPECT_NE(during.describe().find("blocks 2-3: gradient into a slot, AdamW on the device, its "
                                   "state on the host staged through a slot, during backward"),
            std::string::npos)
      << during.describe();
  EXPECT_EQ(plan_of(Mode::kGpu, 1, true, options.update_sites).staging_slots, 0);
  EXPECT_EQ(
      plan_of(Mode::kGpu, 1, true, options.update_sites).count(TaskKind::kAdamW, Lane::kStaging),
      0);
}

// Streamed weights (ScheduleOptions::streamed_blocks): the last blocks the host updates are filled
// into ring slot layer % 2 before each forward and backward that does not find them there, each
// fill after the slot's last reader and, first in a step, after the block's update of the step
// before; their new weights stay on the host (no "weights" task), and the others are untouched.
TEST(StepPlan, StreamedBlocksAreFilledIntoTheirRingSlotBeforeTheyAreRead) {
  ScheduleOptions options;
  options.streamed_blocks = 3;  // blocks 1-3 (spans 2-4) through slots 1, 0, 1
  for (const Accumulation accumulation :
       {Accumulation::kMicroBatchMajor, Accumulation::kLayerMajor})
    for (const int micro_batches : {1, 3}) {
      options.accumulation = accumulation;
      const StepPlan plan =
          compile_step_plan(Mode::kLayup, layout(), options, kKinds, micro_batches, false);
      SCOPED_TRACE(name_of(accumulation) + ", " + std::to_string(micro_batches));
      EXPECT_EQ(plan.stream_slots, 2);
      EXPECT_FALSE(plan.spans[1].streamed);
      EXPECT_TRUE(plan.spans[2].streamed && plan.spans[3].streamed && plan.spans[4].streamed);
      std::map<int, int> holds;  // slot -> span, replayed from the plan
      std::map<int, int> first_fill;
      for (size_t t = 0; t < plan.tasks.size(); ++t) {
        const PlanTask& task = plan.tasks[t];
        for (const int before : task.after) EXPECT_LT(before, static_cast<int>(t));
        if (task.kind == TaskKind::kWeightsIn) {
          EXPECT_EQ(task.lane, Lane::kToDevice);
          EXPECT_TRUE(plan.spans[task.span].streamed);
          holds[(task.span - 1) % 2] = task.span;
          first_fill.emplace(task.span, static_cast<int>(t));
          continue;
        }
        const bool reads = task.lane == Lane::kDevice &&
                           (task.kind == TaskKind::kForward || task.kind == TaskKind::kBackward);
        if (!reads || !plan.spans[task.span].streamed) continue;
        // The slot holds the block it reads; a fill it waits for is the one just before it.
        EXPECT_EQ(holds[(task.span - 1) % 2], task.span) << plan.task_name(task);
        const bool filled = plan.tasks[t - 1].kind == TaskKind::kWeightsIn;
        EXPECT_EQ(filled, waits_for(plan, static_cast<int>(t), static_cast<int>(t) - 1));
      }
      for (const auto& [span, fill] : first_fill) {
        const std::vector<int>& last_step = plan.tasks[fill].after_last_step;
        EXPECT_NE(std::find(last_step.begin(), last_step.end(), find(plan, TaskKind::kAdamW, span)),
                  last_step.end());
        EXPECT_EQ(find(plan, TaskKind::kWeightsToDevice, span), -1);
      }
      EXPECT_NE(find(plan, TaskKind::kWeightsToDevice, 1), -1);
      // One micro-batch: the forward fills blocks 1, 2, 3; the backward finds 3 and 2 in their
      // slots and fills 1 again. Micro-batch-major, each later micro-batch's forward finds 1 and 2
      // still there and fills 3, its backward fills 1; layer-major, the forward fills each block
      // once for every micro-batch, and the backward of every micro-batch only block 1, once:
      // four fills whatever the count.
      const int fills = accumulation == Accumulation::kMicroBatchMajor && micro_batches > 1
                            ? 4 + 2 * (micro_batches - 1)
                            : 4;
      EXPECT_EQ(plan.count(TaskKind::kWeightsIn, Lane::kToDevice), fills);
      // The forward's fill of block 3 waits for block 1's forward, which read slot 1 before it
      // (layer-major: block 1's forward of the last micro-batch).
      const int fill_3 = find(plan, TaskKind::kWeightsIn, 4, 0);
      const int reader = accumulation == Accumulation::kLayerMajor && micro_batches > 1
                             ? find(plan, TaskKind::kForward, 2, micro_batches - 1)
                             : find(plan, TaskKind::kForward, 2, 0);
      EXPECT_TRUE(waits_for(plan, fill_3, reader));
    }
  // gpu mode has nothing to stream from.
  EXPECT_THROW(compile_step_plan(Mode::kGpu, layout(), options, kKinds, 1, false), Error);
  options.streamed_blocks = 5;  // more than the 4 blocks
  EXPECT_THROW(compile_step_plan(Mode::kLayup, layout(), options, kKinds, 1, false), Error);
}

TEST(StepPlan, DescribesItselfInAFewLines) {
  const StepPlan plan = plan_of(Mode::kLayup, 1, false,
                                {UpdateSite::kDevice, UpdateSite::kHost, UpdateSite::kHost,
                                 UpdateSite::kHost, UpdateSite::kHost, UpdateSite::kDevice});
  const std::string text = plan.describe();
  EXPECT_NE(text.find("blocks 0-3: gradient into a slot, AdamW on the host during backward"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("embeddings: gradient into its own buffer, AdamW on the device"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("cpu workers"), std::string::npos) << text;
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 14) << text;
}

TEST(StepPlan, RefusesSitesOfAnotherModel) {
  EXPECT_THROW(plan_of(Mode::kLayup, 1, false, {UpdateSite::kHost}), Error);
  EXPECT_THROW(plan_of(Mode::kLayup, 0), Error);
}

}  // namespace
}  // namespace layup
