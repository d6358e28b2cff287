// Several ranks on the CPU backend, started by mpirun (tests/oracle/test_data_parallel.py runs this
// suite as two ranks; as one process it skips): each rank takes one micro-batch of a step of two,
// and every mode and placement, layup's device-updated spans among them (summed over the ranks
// where they are, not in the host accumulator), ends bitwise like one process taking both.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

constexpr int kBatch = 2, kSeqLen = 8, kSteps = 6;

struct Trained {
  std::vector<float> losses;
  std::vector<double> norms;
  OptimizerTensors tensors;
};

// kSteps steps of `micro_batches` micro-batches drawn from one seed; this process takes those at
// `first`, `first + 1`, ... (`taken` of them).
Trained train(Mode mode, const ScheduleOptions& options, int micro_batches, int first, int taken) {
  const ModelConfig config = gpt2_config(3, 2, 32, 16, 61);
  const ParameterLayout layout(config);
  std::unique_ptr<Schedule> schedule = make_schedule(
      mode, make_cpu_backend(config, kBatch, kSeqLen), make_cpu_device(), layout, options);
  schedule->import_tensors(fresh_optimizer_tensors(layout, 7));
  std::mt19937 rng(2024);
  const size_t tokens = static_cast<size_t>(kBatch) * kSeqLen;
  std::vector<std::vector<int32_t>> inputs(micro_batches), targets(micro_batches);
  Trained trained;
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < micro_batches; ++k) {
      inputs[k].resize(tokens);
      targets[k].resize(tokens);
      for (size_t i = 0; i < tokens; ++i) {
        inputs[k][i] = static_cast<int32_t>(rng() % config.vocab_size);
        targets[k][i] = static_cast<int32_t>(rng() % config.vocab_size);
      }
    }
    std::vector<TokenBatch> batches;
    for (int k = first; k < first + taken; ++k)
      batches.push_back({inputs[k].data(), targets[k].data(), kBatch, kSeqLen});
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-2f;
    settings.adamw.t = step + 1;
    // Clipped, unclipped, and no clipping (layup then updates blocks during backward).
    settings.clip_max_norm = step % 3 == 2 ? 0.0f : step % 3 == 0 ? 1e-3f : 1e6f;
    const StepStats stats = schedule->step(batches, settings);
    EXPECT_TRUE(stats.applied);
    trained.losses.push_back(stats.loss);
    trained.norms.push_back(stats.grad_norm);
  }
  trained.tensors = schedule->export_tensors();
  return trained;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(RanksEquivalence, EveryModeAndPlacementTrainsLikeOneProcess) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  if (world->size() < 2)
    GTEST_SKIP() << "one process: mpirun -np 2 runs this (test_data_parallel.py)";
  const ParameterLayout layout(gpt2_config(3, 2, 32, 16, 61));
  std::vector<UpdateSite> head_and_block_0 = head_on_device(layout);
  head_and_block_0[1] = UpdateSite::kDevice;
  struct Case {
    std::string name;
    Mode mode;
    ScheduleOptions options;
  };
  const std::vector<Case> cases = {
      {"gpu", Mode::kGpu, {}},
      {"offload", Mode::kOffload, {}},
      {"layup, head on the device, deferred",
       Mode::kLayup,
       {.update_sites = head_on_device(layout)}},
      {"layup, head and block 0 on the device, speculative",
       Mode::kLayup,
       {.speculative_clip = true, .update_sites = head_and_block_0}},
      {"layup, head and block 0 on the device, deferred",
       Mode::kLayup,
       {.update_sites = head_and_block_0}},
  };
  const int ranks = world->size();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Trained one = train(c.mode, c.options, ranks, 0, ranks);
    ScheduleOptions ranked = c.options;
    ranked.ranks = world.get();
    const Trained mine = train(c.mode, ranked, ranks, world->rank(), 1);
    EXPECT_NE(one.losses.front(), one.losses.back());
    EXPECT_TRUE(bitwise_equal(one.losses, mine.losses)) << "losses";
    EXPECT_TRUE(bitwise_equal(one.norms, mine.norms)) << "gradient norms";
    EXPECT_TRUE(bitwise_equal(one.tensors.params, mine.tensors.params)) << "weights";
    EXPECT_TRUE(bitwise_equal(one.tensors.adam_m, mine.tensors.adam_m)) << "m";
    EXPECT_TRUE(bitwise_equal(one.tensors.adam_v, mine.tensors.adam_v)) << "v";
  }
  world.reset();
  finish_ranks();
}

}  // namespace
}  // namespace layup
