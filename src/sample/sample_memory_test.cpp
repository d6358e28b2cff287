// Pins `layup sample`'s memory plan: what each part is made of, that an 8B model in fp32 is refused
// on a 24 GiB GPU with advice that fits (bf16) and fits in bf16, and that the CPU plan is host
// memory.
#include "sample/sample_memory.h"

#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/cpu_backend_buffers.h"
#include "backend/model_backend.h"
#include "core/error.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

std::string refusal(const SampleMemoryPlan& plan, size_t host, size_t device) {
  try {
    check_sample_memory(plan, host, "the test's budget", device);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(SampleMemory, AnEightBModelNeedsBf16OnA24GiBGpu) {
  const ModelConfig config = named_config("llama-3-8b");
  SampleMemoryRequest request{config, DeviceKind::kCuda, false, 8192, 128, true};
  const SampleMemoryPlan fp32 = plan_sample_memory(request);
  const size_t params = ParameterLayout(config).total_count();
  EXPECT_EQ(fp32.device_weights, params * 4);
  EXPECT_EQ(fp32.kv_cache, 2u * 32 * 8192 * 8 * 128 * 4);  // L, positions, kv heads, head dim
  const std::string why = refusal(fp32, 64 * kGiB, 24 * kGiB);
  EXPECT_NE(why.find("of GPU memory"), std::string::npos) << why;
  EXPECT_NE(why.find("--dtype bf16"), std::string::npos) << why;
  EXPECT_NE(why.find("key/value cache"), std::string::npos) << why;

  request.bf16 = true;
  const SampleMemoryPlan bf16 = plan_sample_memory(request);
  EXPECT_GE(bf16.device_weights, params * 2);
  EXPECT_LT(bf16.device_weights, params * 2 + 64 * 1024 * 1024);  // the copy's alignment padding
  EXPECT_EQ(bf16.kv_cache, fp32.kv_cache / 2);
  EXPECT_LT(bf16.device_bytes(), 24 * kGiB);
  EXPECT_EQ(refusal(bf16, 64 * kGiB, 24 * kGiB), "");
  // The weights are read into host memory in fp32 first.
  EXPECT_NE(refusal(bf16, 16 * kGiB, 24 * kGiB).find("of host memory"), std::string::npos);
}

TEST(SampleMemory, TheCpuPlanIsHostMemory) {
  const ModelConfig config = gpt2_config(2, 2, 16, 64, 61);
  const SampleMemoryPlan cached =
      plan_sample_memory({config, DeviceKind::kCpu, false, 64, 16, true});
  size_t workspace = 0;
  for (const PlannedAllocation& buffer : cpu_backend_buffers(config, 1, 16))
    workspace += buffer.bytes;
  EXPECT_EQ(cached.workspace, workspace);
  EXPECT_EQ(cached.kv_cache, kv_cache_bytes(config, 64, 4));
  EXPECT_EQ(cached.host_bytes(), cached.loaded_weights + cached.kv_cache + cached.workspace);
  EXPECT_EQ(cached.device_bytes(), 0u);
  const SampleMemoryPlan recomputed =
      plan_sample_memory({config, DeviceKind::kCpu, false, 64, 64, false});
  EXPECT_EQ(recomputed.kv_cache, 0u);
  const std::string why = refusal(cached, cached.host_bytes() - 1, 0);
  EXPECT_NE(why.find("of host memory"), std::string::npos) << why;
  EXPECT_EQ(refusal(cached, cached.host_bytes(), 0), "");
}

}  // namespace
}  // namespace layup
