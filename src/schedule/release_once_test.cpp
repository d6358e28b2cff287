// ReleaseOnce runs its action once: when asked, when it goes, and when several threads ask at
// once.
#include "schedule/release_once.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace layup {
namespace {

TEST(ReleaseOnce, RunsWhenAskedAndNotAgainWhenItGoes) {
  int runs = 0;
  {
    ReleaseOnce release([&] { ++runs; });
    release.now();
    EXPECT_EQ(runs, 1);
    release.now();
  }
  EXPECT_EQ(runs, 1);
}

TEST(ReleaseOnce, RunsWhenTheLastHolderLetsGo) {
  int runs = 0;
  auto release = std::make_shared<ReleaseOnce>([&] { ++runs; });
  std::shared_ptr<ReleaseOnce> copy = release;
  release.reset();
  EXPECT_EQ(runs, 0);
  copy.reset();
  EXPECT_EQ(runs, 1);
}

TEST(ReleaseOnce, RunsOnceWhenThreadsAskAtOnce) {
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> runs = 0;
    auto release = std::make_shared<ReleaseOnce>([&] { ++runs; });
    std::atomic<bool> go = false;
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&go, release] {
        while (!go) std::this_thread::yield();
        release->now();
      });
    go = true;
    for (std::thread& thread : threads) thread.join();
    release.reset();
    EXPECT_EQ(runs, 1) << "round " << round;
  }
}

}  // namespace
}  // namespace layup
