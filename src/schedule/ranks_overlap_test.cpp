// Several ranks, started by mpirun (tests/oracle/test_data_parallel.py runs this suite as two
// ranks; as one process it skips): every sum over the ranks is traced on the "ranks" track, in the
// order of the step plan's ranks lane (the same on every rank, so the collectives pair up), and a
// device-updated block's sum starts as its backward ends and runs while the device computes the
// backward of the block below it: the sums overlap the backward instead of following it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "schedule/forwarding_backend_test_support.h"
#include "schedule/random_step.h"
#include "schedule/ranks_test_support.h"
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

// The CPU backend with each block's backward slowed down by kSlowBackward (the device thread
// sleeps in it), and the ranks' sums by kSlowSum: both far longer than a thread takes to wake up,
// so that whatever the machine's load a sum that runs beside the backward below it is seen to, and
// one that runs before or after it is seen not to.
constexpr auto kSlowBackward = std::chrono::milliseconds(20);
constexpr auto kSlowSum = std::chrono::milliseconds(5);

class SlowBackwardBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override {
    std::this_thread::sleep_for(kSlowBackward);
    inner().backward_block(layer, params, block_grad);
  }
};

// The ranks, with a sleep of kSlowSum before each sum of floats.
class SlowSums final : public Communicator {
 public:
  explicit SlowSums(Communicator& ranks) : ranks_(ranks) {}
  int rank() const override { return ranks_.rank(); }
  int size() const override { return ranks_.size(); }
  int local_rank() const override { return ranks_.local_rank(); }
  void broadcast(std::vector<uint8_t>& bytes, int root) override { ranks_.broadcast(bytes, root); }
  void sum_in_rank_order(float* data, size_t count) override {
    std::this_thread::sleep_for(kSlowSum);
    ranks_.sum_in_rank_order(data, count);
  }
  std::vector<double> gather(double value) override { return ranks_.gather(value); }
  void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) override {
    std::this_thread::sleep_for(kSlowSum);
    ranks_.reduce_scatter_in_rank_order(data, bounds);
  }
  void all_gather(float* data, std::span<const size_t> bounds) override {
    ranks_.all_gather(data, bounds);
  }
  void all_gather(double* data, std::span<const size_t> bounds) override {
    ranks_.all_gather(data, bounds);
  }
  void send(const uint64_t* words, size_t count, int to) override { ranks_.send(words, count, to); }
  void receive(uint64_t* words, size_t count, int from) override {
    ranks_.receive(words, count, from);
  }
  void send(const float* data, size_t count, int to) override { ranks_.send(data, count, to); }
  void receive(float* data, size_t count, int from) override { ranks_.receive(data, count, from); }

 private:
  Communicator& ranks_;
};

// The spans on `track`, in the order they started.
std::vector<TraceEvent> events_on(const TraceRecorder& trace, const std::string& track) {
  std::vector<TraceEvent> events;
  for (const TraceEvent& event : trace.events())
    if (trace.track_name(event.track) == track) events.push_back(event);
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us;
  });
  return events;
}

const TraceEvent* named(const std::vector<TraceEvent>& events, const std::string& name) {
  for (const TraceEvent& event : events)
    if (event.name == name) return &event;
  return nullptr;
}

// gpu mode (every span on the device) and layup's device tier beside host-updated blocks, with
// ZeRO-1 and without, clipped and not.
TEST(RanksTrace, EachDeviceUpdatedBlocksSumRunsBesideTheBackwardBelowIt) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  if (world->size() < 2)
    GTEST_SKIP() << "one process: mpirun -np 2 runs this (test_data_parallel.py)";
  const ParameterLayout layout(config());
  std::vector<UpdateSite> head_and_block_0 = head_on_device(layout);
  head_and_block_0[1] = UpdateSite::kDevice;
  struct Run {
    std::string name;
    Mode mode;
    ScheduleOptions options;
  };
  const std::vector<Run> runs = {
      {"gpu", Mode::kGpu, {}},
      {"gpu, ZeRO-1", Mode::kGpu, {.optimizer_shards = world->size()}},
      {"layup, head and block 0 on the device", Mode::kLayup, {.update_sites = head_and_block_0}},
      {"layup, head and block 0 on the device, ZeRO-1",
       Mode::kLayup,
       {.update_sites = head_and_block_0, .optimizer_shards = world->size()}}};
  for (const Run& run : runs)
    for (const float clip : {0.0f, 1e-3f}) {
      SCOPED_TRACE(run.name + (clip > 0 ? ", clipped" : ""));
      ScheduleOptions options = run.options;
      SlowSums slow_sums(*world);
      options.ranks = &slow_sums;
      const StepPlan plan =
          compile_step_plan(run.mode, layout, options, DeviceKinds{}, 1, clip > 0.0f);
      std::unique_ptr<Schedule> schedule = make_schedule(
          run.mode,
          std::make_unique<SlowBackwardBackend>(make_cpu_backend(config(), kBatch, kSeqLen)),
          make_cpu_device(), layout, options);
      schedule->initialize_fresh(3);
      TraceRecorder trace;
      schedule->set_trace(&trace);
      ASSERT_TRUE(random_step(*schedule, config(), kBatch, kSeqLen, 1, clip).applied);
      schedule->set_trace(nullptr);

      std::vector<std::string> summed, sums;
      const std::vector<TraceEvent> ranks = events_on(trace, "ranks");
      for (const TraceEvent& event : ranks)
        if (starts_with(event.name, "sum over ranks")) summed.push_back(event.name);
      for (const PlanTask& task : plan.tasks)
        if (task.lane == Lane::kRanks) sums.push_back(plan.task_name(task));
      EXPECT_EQ(sums.size(), layout.spans().size());
      EXPECT_EQ(summed, sums);

      const std::vector<TraceEvent> device = events_on(trace, "GPU");
      int overlapped = 0;
      for (int layer = 1; layer < config().n_layer; ++layer) {
        if (plan.spans[1 + layer].site != UpdateSite::kDevice ||
            plan.spans[layer].site != UpdateSite::kDevice)
          continue;
        const TraceEvent* sum = named(ranks, "sum over ranks block " + std::to_string(layer));
        const TraceEvent* below = named(device, "backward_block " + std::to_string(layer - 1));
        ASSERT_TRUE(sum != nullptr && below != nullptr) << "block " << layer;
        EXPECT_LT(sum->start_us, below->end_us)
            << "block " << layer << "'s sum over the ranks waited for block " << layer - 1
            << "'s backward";
        EXPECT_GT(sum->end_us, below->start_us)
            << "block " << layer << "'s sum over the ranks held up block " << layer - 1
            << "'s backward";
        ++overlapped;
      }
      // gpu: every block but the last computed has one below it.
      if (run.mode == Mode::kGpu) {
        EXPECT_EQ(overlapped, config().n_layer - 1);
      }
    }
}

}  // namespace
}  // namespace layup
