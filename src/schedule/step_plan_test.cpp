// The step plans the modes compile to: which tasks, on which lanes, in which order, after what.
#include "schedule/step_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
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
                 std::vector<UpdateSite> sites = {}) {
  ScheduleOptions options;
  options.update_sites = std::move(sites);
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
       UpdateSite::kDisk, UpdateSite::kHost}};
  for (const Mode mode : {Mode::kGpu, Mode::kOffload, Mode::kLayup})
    for (const int micro_batches : {1, 3})
      for (const bool clipping : {false, true})
        for (const auto& sites : placements) {
          const StepPlan plan = plan_of(mode, micro_batches, clipping, sites);
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
