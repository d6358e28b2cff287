// gpu mode on CUDA with bf16 and 8-bit optimizer state (--optimizer-state): it trains, the AdamW
// pass writes the bf16 compute copy in every kind (a forward after training reads exactly what a
// fresh schedule's cast of the same weights gives), and the coded state leaves and enters a
// schedule bit for bit (SpanState::coded, what checkpoints carry).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_test_support.h"
#include "core/rng.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

constexpr int kBatch = 4, kSeqLen = 32;

struct Case {
  ComputeDtype dtype;
  OptimizerStateKind kind;
};

class CompactStateSchedule : public testing::TestWithParam<Case> {
 protected:
  CompactStateSchedule() : config(gpt2_config(2, 2, 64, 64, 50257)), layout(config) {}

  std::unique_ptr<Schedule> make(OptimizerStateKind kind) const {
    return make_schedule(Mode::kGpu, make_cuda_backend(config, kBatch, kSeqLen, GetParam().dtype),
                         make_cuda_device(), layout, {.optimizer_state = kind});
  }
  std::vector<int32_t> tokens(uint64_t seed) const {
    Rng rng(seed);
    std::vector<int32_t> t(2 * kBatch * kSeqLen);
    for (int32_t& token : t) token = static_cast<int32_t>(rng.next_u64() % config.vocab_size);
    return t;
  }
  TokenBatch batch(const std::vector<int32_t>& t) const {
    const size_t n = kBatch * kSeqLen;
    return {t.data(), t.data() + n, kBatch, kSeqLen};
  }
  // Five steps from a fresh state, clipped on every other one; the last step's loss.
  float train(Schedule& schedule) const {
    schedule.import_tensors(fresh_optimizer_tensors(layout, 5));
    float loss = 0.0f;
    for (int step = 0; step < 5; ++step) {
      const std::vector<int32_t> t = tokens(100 + step);
      const TokenBatch micro_batches[] = {batch(t)};
      UpdateSettings settings;
      settings.adamw.hyper.lr = 1e-2f;
      settings.adamw.t = step + 1;
      settings.clip_max_norm = step % 2 == 0 ? 1e-3f : 1e6f;
      const StepStats stats = schedule.step(micro_batches, settings);
      EXPECT_TRUE(stats.applied);
      loss = stats.loss;
    }
    return loss;
  }

  const ModelConfig config;
  const ParameterLayout layout;
};

TEST_P(CompactStateSchedule, TrainsWritesItsComputeCopyAndCarriesItsCodedState) {
  LAYUP_REQUIRE_GPU();
  const OptimizerStateKind kind = GetParam().kind;
  std::unique_ptr<Schedule> compact = make(kind), exact = make(OptimizerStateKind::kFp32);
  EXPECT_EQ(compact->optimizer_state(), kind);
  const std::vector<int32_t> probe_tokens = tokens(7);
  const TokenBatch probe = batch(probe_tokens);
  compact->import_tensors(fresh_optimizer_tensors(layout, 5));
  const float initial = compact->evaluate(probe);
  const float compact_loss = train(*compact), exact_loss = train(*exact);
  // It trains, close to fp32 moments' trajectory (the first step is the same: fresh moments).
  EXPECT_LT(compact->evaluate(probe), initial);
  EXPECT_NEAR(compact_loss, exact_loss, 0.05 * exact_loss);

  // The coded state into a fresh schedule and back out, bit for bit; its forward, which casts the
  // imported weights, reads what the trained one's AdamW wrote into the compute copy.
  std::unique_ptr<Schedule> copy = make(kind);
  for (size_t index = 0; index < layout.spans().size(); ++index) {
    const Span& span = layout.spans()[index];
    std::vector<float> params(span.count),
        coded(optimizer_moments_padded_bytes(kind, span.count) / 4);
    compact->export_span(index, {params.data(), nullptr, nullptr, coded.data()});
    copy->import_span(index, {params.data(), nullptr, nullptr, coded.data()});
    std::vector<float> again(coded.size(), -1.0f);
    copy->export_span(index, {nullptr, nullptr, nullptr, again.data()});
    EXPECT_EQ(std::memcmp(coded.data(), again.data(), coded.size() * 4), 0) << "span " << index;
  }
  EXPECT_EQ(copy->evaluate(probe), compact->evaluate(probe));
  const OptimizerTensors a = compact->export_tensors(), b = copy->export_tensors();
  EXPECT_EQ(a.adam_m, b.adam_m);
  EXPECT_EQ(a.adam_v, b.adam_v);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, CompactStateSchedule,
    testing::Values(Case{ComputeDtype::kFloat32, OptimizerStateKind::kBf16},
                    Case{ComputeDtype::kFloat32, OptimizerStateKind::kBlockwise8Bit},
                    Case{ComputeDtype::kBFloat16, OptimizerStateKind::kBf16},
                    Case{ComputeDtype::kBFloat16, OptimizerStateKind::kBlockwise8Bit}),
    [](const testing::TestParamInfo<Case>& info) {
      return std::string(info.param.dtype == ComputeDtype::kFloat32 ? "fp32" : "bf16") + "_" +
             (info.param.kind == OptimizerStateKind::kBf16 ? "bf16" : "8bit");
    });

}  // namespace
}  // namespace layup
