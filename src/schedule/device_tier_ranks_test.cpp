// DeviceTier under ZeRO-1, as several ranks (mpirun; one process skips): each rank updates its
// part of every device-updated span, the parts are gathered, and where the backend keeps bf16
// compute copies the gathered weights are cast into them after the gather, so that weights landing
// in the compute copy (layup on a bf16 GPU) need no cast at the next forward.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "comm/communicator.h"
#include "optim/adamw.h"
#include "schedule/device_tier.h"
#include "schedule/forwarding_device_test_support.h"
#include "schedule/micro_batch_gradients.h"
#include "schedule/optimizer_shards.h"
#include "schedule/ranks_test_support.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

// The CPU device, with each cast into a compute copy recorded (the CPU keeps none to write): where
// it went, and the weights it read at that moment.
class CastRecordingDevice final : public ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  struct Cast {
    void* compute_copy;
    std::vector<float> weights;
  };
  void cast_to_compute_copy(void* dst, const float* src, size_t count) override {
    casts.push_back({dst, std::vector<float>(src, src + count)});
  }
  std::vector<Cast> casts;
};

TEST(RanksEquivalence, DeviceTierCastsTheGatheredWeightsIntoTheComputeCopies) {
  std::unique_ptr<Communicator> world = make_world_communicator();
  if (world->size() < 2)
    GTEST_SKIP() << "one process: mpirun -np 2 runs this (test_data_parallel.py)";
  // The embeddings' span, three sum-of-squares chunks long, is cut between the ranks: each
  // rank's update alone leaves the others' part of it as it was.
  const ParameterLayout layout(gpt2_config(1, 2, 64, 16, 2100));
  const size_t spans = layout.spans().size();
  const OptimizerShards shards = optimizer_shards(layout, world->size());
  const OptimizerShards::Part part = shards.part(layout.spans()[0], world->rank());
  ASSERT_LT(part.count, layout.spans()[0].count);
  ScheduleOptions options{.update_sites = head_on_device(layout),
                          .optimizer_shards = world->size()};
  options.ranks = world.get();
  CastRecordingDevice device(make_cpu_device());
  MicroBatchGradients gradients(device, layout, /*whole=*/false, device.memory_kind());
  DeviceTier tier(device, layout, options, gradients, device.memory_kind(), device.memory_kind());
  ASSERT_TRUE(tier.sharded());
  ASSERT_EQ(tier.spans(), (std::vector<size_t>{0, spans - 1}));
  tier.begin_step(1);

  // The same weights and gradient on every rank (as after the reduce-scatter, each rank's part
  // being the sum), fresh moments.
  std::vector<std::vector<float>> weights(spans), expected(spans);
  std::vector<float*> weight_pointers(spans, nullptr);
  std::vector<void*> compute_copies(spans, nullptr);
  std::vector<std::vector<uint16_t>> bf16(spans);
  const AdamWStep adamw{.hyper = {.lr = 1e-2f}, .t = 1, .grad_scale = 1.0f};
  for (const size_t index : tier.spans()) {
    const Span& span = layout.spans()[index];
    weights[index].resize(span.count);
    std::vector<float> zeros(span.count, 0.0f);
    for (size_t i = 0; i < span.count; ++i) {
      weights[index][i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
      tier.gradient(index)[i] = 0.003f * static_cast<float>(i % 13) - 0.02f;
    }
    tier.write_span(index, {weights[index].data(), zeros.data(), zeros.data()});
    // One process's update of the whole span: the bits every rank's gather must end with.
    expected[index] = weights[index];
    std::vector<float> m(span.count, 0.0f), v(span.count, 0.0f);
    adamw_update_span(layout, span, expected[index].data(), tier.gradient(index), m.data(),
                      v.data(), adamw);
    weight_pointers[index] = weights[index].data();
    bf16[index].resize(span.count);
    compute_copies[index] = bf16[index].data();
  }

  // Without compute copies nothing is cast, and the copies are not current.
  std::vector<std::vector<float>> before = weights;
  EXPECT_FALSE(tier.update(adamw, weight_pointers, {}, nullptr, 0));
  EXPECT_TRUE(device.casts.empty());
  for (const size_t index : tier.spans()) EXPECT_EQ(weights[index], expected[index]);

  // With them: every span's gathered weights cast into its copy, once, after the gather (the
  // update changed every part, this rank's and the others').
  ASSERT_NE(expected[0][part.first], before[0][part.first]);
  ASSERT_NE(expected[0][(part.first + part.count) % before[0].size()],
            before[0][(part.first + part.count) % before[0].size()]);
  for (const size_t index : tier.spans()) {
    weights[index] = before[index];
    tier.write_span(index, {weights[index].data(), std::vector<float>(weights[index].size()).data(),
                            std::vector<float>(weights[index].size()).data()});
  }
  EXPECT_TRUE(tier.update(adamw, weight_pointers, compute_copies, nullptr, 0));
  ASSERT_EQ(device.casts.size(), tier.spans().size());
  for (size_t k = 0; k < tier.spans().size(); ++k) {
    const size_t index = tier.spans()[k];
    EXPECT_EQ(device.casts[k].compute_copy, compute_copies[index]);
    EXPECT_EQ(device.casts[k].weights, expected[index]) << "span " << index;
    EXPECT_EQ(weights[index], expected[index]) << "span " << index;
  }
}

}  // namespace
}  // namespace layup
