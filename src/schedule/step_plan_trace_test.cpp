// The schedules run the step plans they are compiled to: a traced step's device work (each
// forward of a span, each backward and each AdamW on the device) comes in the order of its plan's
// device lane, named as its tasks, in every mode and placement, micro-batch-major and layer-major;
// the host's updates come in its CPU lane's order where the plan orders them (offload, and layup's
// after the norm with several micro-batches); gpu's runs nothing on the host's CPU workers; the
// streamed blocks' fills come in the to-device lane's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "schedule/random_step.h"
#include "schedule/schedule.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {
namespace {

constexpr int kBatch = 2, kSeqLen = 8;

ModelConfig config() {
  return gpt2_config(4, 2, 32, 16, 61);
}

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

// The names of the spans on `track` that are a span's forward (ForwardWaits names them "forward
// embeddings", "forward block 3", "forward head"), backward or AdamW work, in the order they
// started.
std::vector<std::string> traced(const TraceRecorder& trace, const std::string& track) {
  std::vector<TraceEvent> events;
  for (const TraceEvent& event : trace.events())
    if (trace.track_name(event.track) == track &&
        (starts_with(event.name, "forward ") || starts_with(event.name, "backward") ||
         starts_with(event.name, "adamw")))
      events.push_back(event);
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  std::vector<std::string> names;
  for (const TraceEvent& event : events) names.push_back(event.name);
  return names;
}

// The names of the plan's forward, backward and AdamW tasks on `lane`, in its order, a forward
// named as the forward's trace names it.
std::vector<std::string> planned(const StepPlan& plan, Lane lane) {
  std::vector<std::string> names;
  for (const PlanTask& task : plan.tasks) {
    if (task.lane != lane) continue;
    const std::string name = plan.task_name(task);
    if (task.kind == TaskKind::kForward)
      names.push_back(name == "forward final_norm" ? "forward head" : name);
    else if (task.kind == TaskKind::kBackward || task.kind == TaskKind::kAdamW)
      names.push_back(name);
  }
  return names;
}

TEST(StepPlanTrace, EveryModesDeviceWorkFollowsItsPlan) {
  const ParameterLayout layout(config());
  std::vector<UpdateSite> two_blocks_on_device = head_on_device(layout);
  two_blocks_on_device[1] = two_blocks_on_device[2] = UpdateSite::kDevice;
  const std::vector<std::pair<Mode, std::vector<UpdateSite>>> runs = {
      {Mode::kGpu, {}},
      {Mode::kOffload, {}},
      {Mode::kLayup, {}},
      {Mode::kLayup, head_on_device(layout)},
      {Mode::kLayup, two_blocks_on_device}};
  for (const auto& [mode, sites] : runs)
    for (const int micro_batches : {1, 2})
      for (const float clip : {0.0f, 1e-3f})
        for (const Accumulation accumulation :
             {Accumulation::kMicroBatchMajor, Accumulation::kLayerMajor}) {
          if (accumulation == Accumulation::kLayerMajor &&
              (mode == Mode::kGpu || micro_batches == 1))
            continue;
          SCOPED_TRACE(name_of(mode) + " x" + std::to_string(micro_batches) +
                       (clip > 0 ? " clipped" : "") + (sites.empty() ? "" : " with device spans") +
                       " " + name_of(accumulation));
          ScheduleOptions options;
          options.update_sites = sites;
          options.accumulation = accumulation;
          // Layer-major keeps a host gradient only to clip.
          options.host_gradient = accumulation == Accumulation::kMicroBatchMajor || clip > 0.0f;
          const StepPlan plan =
              compile_step_plan(mode, layout, options, DeviceKinds{}, micro_batches, clip > 0.0f);
          std::unique_ptr<Schedule> schedule =
              make_schedule(mode, make_cpu_backend(config(), kBatch, kSeqLen), make_cpu_device(),
                            layout, options);
          schedule->initialize_fresh(3);
          TraceRecorder trace;
          schedule->set_trace(&trace);
          ASSERT_TRUE(
              random_step(*schedule, config(), kBatch, kSeqLen, micro_batches, clip).applied);
          schedule->set_trace(nullptr);  // waits for updates still in flight
          EXPECT_EQ(traced(trace, "GPU"), planned(plan, Lane::kDevice));
          // gpu's plan puts nothing on the host's lanes, and the executor starts no CPU worker for
          // it and sends no weights.
          if (mode == Mode::kGpu)
            for (const TraceEvent& event : trace.events()) {
              const std::string track = trace.track_name(event.track);
              EXPECT_FALSE(starts_with(track, "cpu worker") || track == "to device")
                  << event.name << " on " << track;
            }
          // The host's updates follow the CPU lane where the head's gradient is on the host before
          // the norm (offload; layup after the norm with several micro-batches, which the host
          // sums micro-batch-major). Elsewhere the coordinator takes the head's update ahead of
          // queued blocks whenever its gradient lands.
          if (plan.window == UpdateWindow::kAfterNorm &&
              (mode == Mode::kOffload ||
               (micro_batches > 1 && accumulation == Accumulation::kMicroBatchMajor))) {
            EXPECT_EQ(traced(trace, "cpu workers"), planned(plan, Lane::kCpu));
          }
        }
}

// Streamed weights: the ring's thread fills the slots in the order of the plan's "weights in"
// tasks (each traced on "to device" as the plan names it), micro-batch-major and layer-major, in
// offload and layup.
TEST(StepPlanTrace, StreamedBlocksAreFilledInTheirLanesOrder) {
  const ParameterLayout layout(config());
  for (const Mode mode : {Mode::kOffload, Mode::kLayup})
    for (const Accumulation accumulation :
         {Accumulation::kMicroBatchMajor, Accumulation::kLayerMajor}) {
      SCOPED_TRACE(name_of(mode) + " " + name_of(accumulation));
      ScheduleOptions options;
      options.accumulation = accumulation;
      options.streamed_blocks = 3;
      const StepPlan plan = compile_step_plan(mode, layout, options, DeviceKinds{}, 2, true);
      std::unique_ptr<Schedule> schedule = make_schedule(
          mode, make_cpu_backend(config(), kBatch, kSeqLen), make_cpu_device(), layout, options);
      schedule->initialize_fresh(3);
      TraceRecorder trace;
      schedule->set_trace(&trace);
      ASSERT_TRUE(random_step(*schedule, config(), kBatch, kSeqLen, 2, 1e-3f).applied);
      schedule->set_trace(nullptr);
      std::vector<TraceEvent> events;
      for (const TraceEvent& event : trace.events())
        if (trace.track_name(event.track) == "to device" && starts_with(event.name, "weights in"))
          events.push_back(event);
      std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
        return a.start_us < b.start_us;
      });
      std::vector<std::string> filled, fills;
      for (const TraceEvent& event : events) filled.push_back(event.name);
      for (const PlanTask& task : plan.tasks)
        if (task.kind == TaskKind::kWeightsIn) fills.push_back(plan.task_name(task));
      EXPECT_FALSE(fills.empty());
      EXPECT_EQ(filled, fills);
    }
}

}  // namespace
}  // namespace layup
