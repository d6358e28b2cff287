// DeviceThread runs each piece of work on its own thread, returns once it is done, passes on what
// it threw, and gives the thread the creator's OpenMP thread count.
#include "schedule/device_thread.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <stdexcept>
#include <thread>

namespace layup {
namespace {

TEST(DeviceThread, RunsWorkOnItsThreadAndWaitsForIt) {
  DeviceThread device;
  std::thread::id ran_on;
  int value = 0;
  device.run([&] {
    ran_on = std::this_thread::get_id();
    value = 1;
  });
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_EQ(value, 1);  // written by the work, read after run() returned
  std::thread::id again;
  device.run([&] { again = std::this_thread::get_id(); });
  EXPECT_EQ(again, ran_on) << "one thread for every piece of work";
}

TEST(DeviceThread, RethrowsAndGoesOn) {
  DeviceThread device;
  EXPECT_THROW(device.run([] { throw std::runtime_error("device work failed"); }),
               std::runtime_error);
  bool ran = false;
  device.run([&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(DeviceThread, AdoptsTheCreatorsOpenMpThreadCount) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(before == 1 ? 2 : 1);
  const int wanted = omp_get_max_threads();
  DeviceThread device;
  int seen = 0;
  device.run([&] { seen = omp_get_max_threads(); });
  omp_set_num_threads(before);
  EXPECT_EQ(seen, wanted);
}

}  // namespace
}  // namespace layup
