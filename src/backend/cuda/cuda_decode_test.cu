// The CUDA backend's key/value-cache decode against the CPU backend's (itself pinned to the full
// forward by cpu_decode_test.cpp): the logits after a prompt in pieces and then one token at a
// time, on a tiny GPT-2 and a tiny Llama with grouped K/V heads, biases and llama3 rope scaling.
// fp32 within 1e-5 (relative, over the real vocabulary), bf16 within 3e-2.
#include <gtest/gtest.h>

#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_test_support.h"
#include "core/rng.h"

namespace layup {
namespace {

using cuda_test::DeviceArray;
using cuda_test::relative_error;

ModelConfig tiny_llama() {
  ModelConfig config = llama_config(2, 4, 2, 32, 48, 16, 61);
  config.attention_bias = true;
  config.rope_scaling = {true, 8.0f, 1.0f, 4.0f, 4};
  config.rope_theta = 500000.0f;
  return config;
}

void expect_cuda_decode_matches_cpu(const ModelConfig& config, ComputeDtype dtype,
                                    double tolerance) {
  const ParameterLayout layout(config);
  std::vector<float> params(layout.total_count());
  Rng rng(5);
  for (float& value : params) value = 0.3f * rng.normal();
  const DeviceArray<float> device_params(params);
  const ParameterPointers host_pointers = layout.pointers<const float>(params.data());
  const ParameterPointers device_pointers =
      layout.pointers<const float>(static_cast<const float*>(device_params.get()));

  const std::vector<int> pieces = {5, 3, 1, 1, 1, 1, 4};
  std::vector<int32_t> tokens;
  for (int piece : pieces)
    for (int i = 0; i < piece; ++i) tokens.push_back(static_cast<int32_t>(rng.below(61)));

  CpuBackend cpu(config, 1, 5);
  const std::unique_ptr<ModelBackend> gpu = make_cuda_backend(config, 1, 5, dtype);
  cpu.start_decode(config.n_positions);
  gpu->start_decode(config.n_positions);
  int position = 0;
  for (int piece : pieces) {
    const std::span<const int32_t> next(tokens.data() + position, piece);
    const float* expected_row = cpu.decode(host_pointers, next);
    const std::vector<float> expected(expected_row, expected_row + config.vocab_size);
    const float* actual_row = gpu->decode(device_pointers, next);
    const std::vector<float> actual(actual_row, actual_row + config.vocab_size);
    position += piece;
    EXPECT_EQ(gpu->decoded_positions(), position);
    EXPECT_LT(relative_error(actual, expected), tolerance) << "position " << position - 1;
  }
}

TEST(CudaDecode, Gpt2MatchesTheCpuInFp32AndBf16) {
  LAYUP_REQUIRE_GPU();
  expect_cuda_decode_matches_cpu(gpt2_config(2, 2, 16, 16, 61), ComputeDtype::kFloat32, 1e-5);
  expect_cuda_decode_matches_cpu(gpt2_config(2, 2, 16, 16, 61), ComputeDtype::kBFloat16, 3e-2);
}

TEST(CudaDecode, LlamaWithGroupedHeadsMatchesTheCpuInFp32AndBf16) {
  LAYUP_REQUIRE_GPU();
  expect_cuda_decode_matches_cpu(tiny_llama(), ComputeDtype::kFloat32, 1e-5);
  expect_cuda_decode_matches_cpu(tiny_llama(), ComputeDtype::kBFloat16, 3e-2);
}

}  // namespace
}  // namespace layup
