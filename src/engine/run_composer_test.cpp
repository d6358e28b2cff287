// The composition root's run for `layup sample`: the CPU reference backend, from the factory.
#include "engine/run_composer.h"

#include <gtest/gtest.h>

#include <vector>

#include "model/init.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

TEST(RunComposer, SamplingRunComputesTheCpuReferenceForward) {
  const ModelConfig config = gpt2_config(2, 2, 16, 8, 61);
  const ParameterLayout layout(config);
  std::vector<float> params(layout.total_count());
  init_parameters(layout, params.data(), 7);
  const ParameterPointers p = layout.pointers<const float>(params.data());
  const std::vector<int32_t> inputs = {3, 14, 15, 9, 2, 6};
  const TokenBatch batch{inputs.data(), nullptr, 1, static_cast<int>(inputs.size())};

  const SamplingRun run = build_sampling_run(config, static_cast<int>(inputs.size()));
  EXPECT_EQ(run.target.device, DeviceKind::kCpu);
  EXPECT_EQ(run.target.dtype, Dtype::kFp32);
  ASSERT_NE(run.compute.backend, nullptr);
  run.compute.backend->forward(p, batch);
  const std::unique_ptr<ModelBackend> reference =
      make_cpu_backend(config, 1, static_cast<int>(inputs.size()));
  reference->forward(p, batch);
  const size_t count = inputs.size() * config.padded_vocab_size;
  const std::vector<float> got(run.compute.backend->logits(),
                               run.compute.backend->logits() + count);
  const std::vector<float> want(reference->logits(), reference->logits() + count);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace layup
