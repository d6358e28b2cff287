// The CUDA device's collectives (NCCL) with one rank, which one GPU can run: the rank-order sum
// of one rank is +0 + x, element by element (a -0 becomes +0), across several rounds and a
// partial last one; a sum started after a fence, on the collectives' stream, is ordered both ways
// with the device's work. Two ranks need two GPUs: tests/oracle/test_data_parallel.py's multi-GPU
// case and bench/run_h200_multi.sh.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/ops/gradient_check.h"
#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/cuda/cuda_test_support.h"
#include "backend/cuda/nccl_collectives.h"
#include "backend/cuda/nccl_library.h"
#include "core/error.h"
#include "core/rng.h"

namespace layup {
namespace {

// One rank's collectives on the CUDA device; skipped without a GPU or without NCCL.
class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    LAYUP_REQUIRE_GPU();
    try {
      nccl::Library::get();
    } catch (const Error& error) {
      GTEST_SKIP() << error.what();
    }
    device = make_cuda_device();
    collectives = device->join_collectives(device->new_collectives_id(), 0, 1);
  }

  // `data`'s `count` floats, copied back to the host.
  std::vector<float> on_host(const DeviceBuffer& data, size_t count) const {
    std::vector<float> host(count);
    device->copy_to_host(host.data(), data.data(), count);
    return host;
  }

  std::unique_ptr<Device> device;
  std::unique_ptr<DeviceCollectives> collectives;
};

TEST_F(NcclCollectives, OneRankSumsFromPlusZero) {
  const size_t count = 2 * kNcclRoundFloats + 12345;
  Rng rng(3);
  std::vector<float> values = op_test::random_vector(rng, count);
  for (size_t i = 0; i < count; i += 1001) values[i] = -0.0f;
  DeviceBuffer data = device->allocate(count, TensorClass::kWeightGrads);
  device->copy_to_device(data.data(), values.data(), count);
  collectives->sum_in_rank_order(data.data(), count);
  const std::vector<float> summed = on_host(data, count);
  for (size_t i = 0; i < count; ++i) {
    const float expected = 0.0f + values[i];
    ASSERT_EQ(std::memcmp(&summed[i], &expected, sizeof(float)), 0) << "element " << i;
  }
}

// ZeRO-1's collectives with one rank: the reduce-scatter of one rank is +0 + x over its shard (a
// rank's shard may start anywhere in the vector), across rounds; the all-gather leaves it as it is.
TEST_F(NcclCollectives, OneRankReduceScattersFromPlusZeroAndGathersItsOwn) {
  const size_t count = kNcclRoundFloats + 4321;
  Rng rng(5);
  std::vector<float> values = op_test::random_vector(rng, count);
  for (size_t i = 0; i < count; i += 997) values[i] = -0.0f;
  DeviceBuffer data = device->allocate(count, TensorClass::kWeightGrads);
  device->copy_to_device(data.data(), values.data(), count);
  const std::vector<size_t> bounds = {0, count};
  collectives->reduce_scatter_in_rank_order(data.data(), bounds);
  collectives->all_gather(data.data(), bounds);
  const std::vector<float> result = on_host(data, count);
  for (size_t i = 0; i < count; ++i) {
    const float expected = 0.0f + values[i];
    ASSERT_EQ(std::memcmp(&result[i], &expected, sizeof(float)), 0) << "element " << i;
  }
}

// The sum started beside the device's work (on the collectives' own stream) sees what the device
// wrote before its fence, and device work ordered after the fence it returns sees the sum: the
// way a schedule sums each block's gradient as its backward ends.
TEST_F(NcclCollectives, AStartedSumWaitsForItsFenceAndTheDeviceOrderedAfterItSeesIt) {
  const size_t count = kNcclRoundFloats + 777;
  Rng rng(4);
  const std::vector<float> values = op_test::random_vector(rng, count);
  const std::vector<float> addend = op_test::random_vector(rng, count);
  DeviceBuffer data = device->allocate(count, TensorClass::kWeightGrads);
  DeviceBuffer other = device->allocate(count, TensorClass::kWeightGrads);
  device->copy_to_device(data.data(), values.data(), count);
  device->copy_to_device(other.data(), addend.data(), count);
  device->add(data.data(), other.data(), count);  // before the fence: the sum reads it
  const std::shared_ptr<const DeviceFence> summed =
      collectives->start_sum_in_rank_order(*device, *device->fence(), data.data(), count);
  device->order_after(*summed);
  device->add(data.data(), other.data(), count);  // after the sum: it adds to the sum
  const std::vector<float> result = on_host(data, count);
  for (size_t i = 0; i < count; ++i) {
    const float expected = (0.0f + (values[i] + addend[i])) + addend[i];
    ASSERT_EQ(std::memcmp(&result[i], &expected, sizeof(float)), 0) << "element " << i;
  }
}

}  // namespace
}  // namespace layup
