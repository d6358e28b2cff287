// The CUDA device's collectives (NCCL) with one rank, which one GPU can run: the rank-order sum
// of one rank is +0 + x, element by element (a -0 becomes +0), across several rounds and a
// partial last one. Two ranks need two GPUs: tests/oracle/test_data_parallel.py's multi-GPU case
// and bench/run_h200_multi.sh.
#include <gtest/gtest.h>

#include <cstring>
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

TEST(NcclCollectives, OneRankSumsFromPlusZero) {
  LAYUP_REQUIRE_GPU();
  try {
    nccl::Library::get();
  } catch (const Error& error) {
    GTEST_SKIP() << error.what();
  }
  std::unique_ptr<Device> device = make_cuda_device();
  std::unique_ptr<DeviceCollectives> collectives =
      device->join_collectives(device->new_collectives_id(), 0, 1);
  const size_t count = 2 * kNcclRoundFloats + 12345;
  Rng rng(3);
  std::vector<float> values = op_test::random_vector(rng, count);
  for (size_t i = 0; i < count; i += 1001) values[i] = -0.0f;
  DeviceBuffer data = device->allocate(count, TensorClass::kWeightGrads);
  device->copy_to_device(data.data(), values.data(), count);
  collectives->sum_in_rank_order(data.data(), count);
  std::vector<float> summed(count);
  device->copy_to_host(summed.data(), data.data(), count);
  for (size_t i = 0; i < count; ++i) {
    const float expected = 0.0f + values[i];
    ASSERT_EQ(std::memcmp(&summed[i], &expected, sizeof(float)), 0) << "element " << i;
  }
}

}  // namespace
}  // namespace layup
