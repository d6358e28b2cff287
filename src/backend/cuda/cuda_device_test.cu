// The CUDA device against the CPU device: memory and copies, the sum of squares (close to the
// CPU's, and bitwise reproducible), and AdamW span by span (the same formula as optim/adamw.cpp),
// on bf16 and 8-bit optimizer state bit for bit the CPU's scalar loop.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/ops/gradient_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_test_support.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"
#include "optim/adamw_simd.h"
#include "optim/adamw_state.h"
#include "optim/grad_norm.h"

namespace layup {
namespace {

using namespace cuda_test;
using op_test::random_vector;

TEST(CudaDevice, AllocatesZeroedMemoryCopiesAndZeroes) {
  LAYUP_REQUIRE_GPU();
  std::unique_ptr<Device> device = make_cuda_device();
  EXPECT_NE(device->name().find("cuda"), std::string::npos);
  const size_t count = 1000003;
  DeviceBuffer buffer = device->allocate(count, TensorClass::kScratch);
  ASSERT_EQ(buffer.count(), count);
  std::vector<float> host(count, 1.0f);
  device->copy_to_host(host.data(), buffer.data(), count);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(host[i], 0.0f) << i;

  Rng rng(1);
  const std::vector<float> values = random_vector(rng, count);
  device->copy_to_device(buffer.data(), values.data(), count);
  device->copy_to_host(host.data(), buffer.data(), count);
  EXPECT_EQ(host, values);

  device->fill_zero(buffer.data() + 5, 10);
  device->copy_to_host(host.data(), buffer.data(), count);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(host[i], (i >= 5 && i < 15) ? 0.0f : values[i]) << i;
  EXPECT_EQ(device->allocate(0, TensorClass::kScratch).data(), nullptr);
}

TEST(CudaDevice, SumOfSquaresMatchesCpuAndIsReproducible) {
  LAYUP_REQUIRE_GPU();
  std::unique_ptr<Device> device = make_cuda_device();
  for (size_t count : {size_t{1}, size_t{3}, size_t{1000}, (size_t{1} << 20) + 7}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      Rng rng(count + offset);
      const std::vector<float> values = random_vector(rng, count, 0.01f);
      DeviceBuffer buffer = device->allocate(count + offset, TensorClass::kScratch);
      device->copy_to_device(buffer.data() + offset, values.data(), count);
      const double gpu = device->sum_of_squares(buffer.data() + offset, count);
      const double cpu = sum_of_squares(values.data(), count);
      EXPECT_NEAR(gpu, cpu, 1e-12 * cpu) << "count " << count << " offset " << offset;
      const double again = device->sum_of_squares(buffer.data() + offset, count);
      EXPECT_EQ(std::memcmp(&gpu, &again, sizeof(double)), 0) << "not bitwise reproducible";

      // Started without waiting, into pinned host memory (poisoned first), read after a fence.
      DeviceBuffer result = device->allocate_host(2, TensorClass::kScratch);
      auto* started = reinterpret_cast<double*>(result.data());
      *started = std::numeric_limits<double>::quiet_NaN();
      device->start_sum_of_squares(buffer.data() + offset, count, started);
      device->wait_for(*device->fence());
      EXPECT_EQ(std::memcmp(&gpu, started, sizeof(double)), 0)
          << "started: " << *started << ", at once: " << gpu;
    }
  }
}

// ZeRO-1's norm: the sums of a range of chunks, each near the CPU's (its own grouping inside a
// chunk), written to their places and nowhere else; a short last chunk; an empty range.
TEST(CudaDevice, ChunkSumsOfSquaresMatchTheCpusChunks) {
  LAYUP_REQUIRE_GPU();
  std::unique_ptr<Device> device = make_cuda_device();
  const size_t count = 5 * kSumOfSquaresChunk + 1234;
  const size_t chunks = sum_of_squares_chunks(count);
  Rng rng(11);
  const std::vector<float> values = random_vector(rng, count, 0.01f);
  DeviceBuffer buffer = device->allocate(count, TensorClass::kScratch);
  device->copy_to_device(buffer.data(), values.data(), count);
  std::vector<double> cpu(chunks, 0.0);
  chunk_sums_of_squares(values.data(), count, 0, chunks, cpu.data());
  for (const auto& [first, end] :
       {std::pair<size_t, size_t>{0, chunks}, {2, chunks}, {1, 3}, {4, 4}}) {
    std::vector<double> gpu(chunks, -1.0);
    device->chunk_sums_of_squares(buffer.data(), count, first, end, gpu.data());
    for (size_t c = 0; c < chunks; ++c) {
      if (c < first || c >= end)
        EXPECT_EQ(gpu[c], -1.0) << "chunk " << c << " of [" << first << ", " << end << ")";
      else
        EXPECT_NEAR(gpu[c], cpu[c], 1e-12 * cpu[c]) << "chunk " << c;
    }
  }
}

TEST(CudaDevice, AdamWMatchesCpuOnEverySpan) {
  LAYUP_REQUIRE_GPU();
  std::unique_ptr<Device> device = make_cuda_device();
  const ParameterLayout layout(gpt2_config(2, 2, 16, 8, 61));
  const size_t n = layout.total_count();

  Rng rng(3);
  std::vector<float> params = random_vector(rng, n), grads = random_vector(rng, n, 0.1f);
  std::vector<float> m = random_vector(rng, n, 0.01f), v = random_vector(rng, n, 0.001f);
  for (float& value : v) value = value * value;  // second moments are not negative
  DeviceBuffer d_params = device->allocate(n, TensorClass::kMasterWeights);
  DeviceBuffer d_grads = device->allocate(n, TensorClass::kWeightGrads);
  DeviceBuffer d_m = device->allocate(n, TensorClass::kOptimizerMoments);
  DeviceBuffer d_v = device->allocate(n, TensorClass::kOptimizerMoments);
  device->copy_to_device(d_params.data(), params.data(), n);
  device->copy_to_device(d_grads.data(), grads.data(), n);
  device->copy_to_device(d_m.data(), m.data(), n);
  device->copy_to_device(d_v.data(), v.data(), n);

  // The bf16 copy the update writes beside the fp32 weights, poisoned so a missed element shows.
  __nv_bfloat16* d_bf16 = nullptr;
  ASSERT_EQ(cudaMalloc(&d_bf16, n * sizeof(__nv_bfloat16)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_bf16, 0xff, n * sizeof(__nv_bfloat16)), cudaSuccess);  // NaNs

  AdamWStep step;
  step.hyper.lr = 3e-3f;
  step.hyper.weight_decay = 0.1f;
  step.t = 7;
  step.grad_scale = 0.8f;
  for (const Span& span : layout.spans()) {
    adamw_update_span(layout, span, params.data() + span.offset, grads.data() + span.offset,
                      m.data() + span.offset, v.data() + span.offset, step);
    // Odd spans without the copy: both forms are the same update.
    const bool with_copy = span.layer % 2 == 0;
    device->adamw_update_span(layout, span, d_params.data() + span.offset,
                              d_grads.data() + span.offset, d_m.data() + span.offset,
                              d_v.data() + span.offset, step,
                              with_copy ? d_bf16 + span.offset : nullptr);
  }
  std::vector<float> result(n);
  device->copy_to_host(result.data(), d_params.data(), n);
  EXPECT_LE(relative_error(result, params), 1e-6) << "params";
  // Where it was asked for, the copy is the new weights rounded to bf16, bit for bit.
  std::vector<__nv_bfloat16> copy(n);
  ASSERT_EQ(cudaMemcpy(copy.data(), d_bf16, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(d_bf16);
  size_t checked = 0;
  for (const Span& span : layout.spans()) {
    if (span.layer % 2 != 0) continue;
    for (size_t i = span.offset; i < span.offset + span.count; ++i, ++checked) {
      const __nv_bfloat16 expected = __float2bfloat16(result[i]);
      ASSERT_EQ(std::memcmp(&copy[i], &expected, sizeof(expected)), 0)
          << "bf16 copy of parameter " << i << ": " << __bfloat162float(copy[i]) << " for "
          << result[i];
    }
  }
  EXPECT_GT(checked, n / 4);
  device->copy_to_host(result.data(), d_m.data(), n);
  EXPECT_LE(relative_error(result, m), 1e-6) << "m";
  device->copy_to_host(result.data(), d_v.data(), n);
  EXPECT_LE(relative_error(result, v), 1e-6) << "v";
}

// bf16 and 8-bit state, updated span by span for three steps on the GPU and by the CPU's scalar
// loop: the same weights, codes, scales and bf16 moments, bit for bit, and the bf16 compute copy
// where it was asked for. Width 40 puts tensor and block boundaries anywhere.
TEST(CudaDevice, CompactStateAdamWMatchesTheCpusScalarLoopBitForBit) {
  LAYUP_REQUIRE_GPU();
  std::unique_ptr<Device> device = make_cuda_device();
  const ParameterLayout layout(gpt2_config(2, 2, 40, 8, 61));
  const size_t n = layout.total_count();
  // The CPU side on its scalar loop, the reference, for this test only.
  struct ScalarCpuLoops {
    ScalarCpuLoops() { set_adamw_defaults({AdamWIsa::kScalar}); }
    ~ScalarCpuLoops() { set_adamw_defaults({}); }
  } scalar;
  for (OptimizerStateKind kind : {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    Rng rng(5);
    std::vector<float> params = random_vector(rng, n), grads = random_vector(rng, n, 0.1f);
    // Each span's moments in optim/adamw_moments.h's one-buffer layout, at 4-byte boundaries.
    std::vector<size_t> at;
    size_t bytes = 0;
    for (const Span& span : layout.spans()) {
      at.push_back(bytes);
      bytes += (optimizer_moments_bytes(kind, span.count) + 3) / 4 * 4;
    }
    std::vector<uint8_t> moments(bytes);
    for (size_t i = 0; i < layout.spans().size(); ++i) {
      const Span& span = layout.spans()[i];
      std::vector<float> m = random_vector(rng, span.count, 0.01f), v(span.count);
      for (float& value : v) value = 1e-4f * rng.uniform() * rng.uniform();
      encode_moments(m.data(), v.data(), span.count,
                     AdamWMoments::in_buffer(kind, moments.data() + at[i], span.count));
    }
    DeviceBuffer d_params = device->allocate(n, TensorClass::kMasterWeights);
    DeviceBuffer d_grads = device->allocate(n, TensorClass::kWeightGrads);
    DeviceBuffer d_moments = device->allocate(bytes / 4, TensorClass::kOptimizerMoments);
    device->copy_to_device(d_params.data(), params.data(), n);
    device->copy_to_device(d_grads.data(), grads.data(), n);
    device->copy_to_device(d_moments.data(), reinterpret_cast<const float*>(moments.data()),
                           bytes / 4);
    __nv_bfloat16* d_bf16 = nullptr;
    ASSERT_EQ(cudaMalloc(&d_bf16, n * sizeof(__nv_bfloat16)), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_bf16, 0xff, n * sizeof(__nv_bfloat16)), cudaSuccess);  // NaNs

    for (int k = 0; k < 3; ++k) {
      AdamWStep step;
      step.hyper.lr = 3e-3f * (1 + k);
      step.hyper.weight_decay = 0.1f;
      step.t = 1 + 2 * k;
      step.grad_scale = 0.8f;
      for (size_t i = 0; i < layout.spans().size(); ++i) {
        const Span& span = layout.spans()[i];
        adamw_update_span(layout, span, params.data() + span.offset, grads.data() + span.offset,
                          AdamWMoments::in_buffer(kind, moments.data() + at[i], span.count), step);
        auto* d_span_moments = reinterpret_cast<uint8_t*>(d_moments.data()) + at[i];
        device->adamw_update_span_state(layout, span, d_params.data() + span.offset,
                                        d_grads.data() + span.offset,
                                        AdamWMoments::in_buffer(kind, d_span_moments, span.count),
                                        step, span.layer % 2 == 0 ? d_bf16 + span.offset : nullptr);
      }
      std::vector<float> result(n);
      device->copy_to_host(result.data(), d_params.data(), n);
      EXPECT_EQ(std::memcmp(result.data(), params.data(), n * sizeof(float)), 0)
          << name_of(kind) << " weights, step " << k;
      std::vector<uint8_t> result_moments(bytes);
      device->copy_to_host(reinterpret_cast<float*>(result_moments.data()), d_moments.data(),
                           bytes / 4);
      EXPECT_EQ(result_moments, moments) << name_of(kind) << " moments, step " << k;
      if (k == 2) {
        std::vector<__nv_bfloat16> copy(n);
        ASSERT_EQ(
            cudaMemcpy(copy.data(), d_bf16, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost),
            cudaSuccess);
        for (const Span& span : layout.spans()) {
          if (span.layer % 2 != 0) continue;
          for (size_t i = span.offset; i < span.offset + span.count; ++i) {
            const __nv_bfloat16 expected = __float2bfloat16(result[i]);
            ASSERT_EQ(std::memcmp(&copy[i], &expected, sizeof(expected)), 0)
                << name_of(kind) << " bf16 copy of parameter " << i;
          }
        }
      }
    }
    cudaFree(d_bf16);
  }
}

TEST(CudaDevice, AvailabilityExplainsItself) {
  std::string why = "unchanged";
  const bool available = cuda_device_available(&why);
  if (available)
    EXPECT_TRUE(why.empty());
  else
    EXPECT_FALSE(why.empty());
  if (!available) EXPECT_THROW(make_cuda_device(), Error);
}

}  // namespace
}  // namespace layup
