// One process, as every run without a launcher is: rank 0 of 1, whose sums leave the data alone.
// Several ranks are tested under mpirun (tests/oracle/test_data_parallel.py).
#include "comm/communicator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

namespace layup {
namespace {

TEST(Communicator, OneProcessIsRankZeroOfOne) {
  const auto single = make_single_process_communicator();
  EXPECT_EQ(single->rank(), 0);
  EXPECT_EQ(single->size(), 1);
  std::vector<float> data = {1.5f, -0.0f, 3.0f};
  single->sum_in_rank_order(data.data(), data.size());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -0.0f, 3.0f}));
  EXPECT_EQ(single->gather(2.5), std::vector<double>{2.5});
}

TEST(Communicator, WithoutALauncherTheWorldIsOneProcess) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    ASSERT_EQ(std::getenv(name), nullptr) << "run the unit tests without mpirun";
  const auto world = make_world_communicator();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
}

}  // namespace
}  // namespace layup
