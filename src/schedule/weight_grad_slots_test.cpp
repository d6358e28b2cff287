// The double-buffer handshake under stress: a fake device thread writes block gradients into the
// two slots while CPU workers check and release them, both with random (seeded) delays. Any slot
// lost or overwritten before its release shows up as a wrong value, a wrong generation or a slot
// seen in use by both sides; under ThreadSanitizer, as a data race.
#include "schedule/weight_grad_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "schedule/cpu_update_pool.h"

namespace layup {
namespace {

void maybe_sleep(std::mt19937& rng) {
  // Half the time no delay, else up to 20 microseconds: both orders of every race get exercised.
  const int micros = static_cast<int>(rng() % 40) - 20;
  if (micros > 0) std::this_thread::sleep_for(std::chrono::microseconds(micros));
}

TEST(WeightGradSlots, HandshakeSurvivesRandomDelays) {
  constexpr int kSteps = 1000;
  constexpr int kLayers = 6;
  constexpr size_t kBlockCount = 256;
  std::unique_ptr<Device> device = make_cpu_device();
  WeightGradSlots slots(*device, kBlockCount, device->memory_kind());
  CpuUpdatePool pool(3);

  std::atomic<int> wrong_values{0}, wrong_generations{0}, overlapping_use{0};
  std::atomic<bool> held_by_worker[WeightGradSlots::kSlotCount] = {false, false};
  std::vector<char> seen(kSteps * kLayers, 0);  // one element per lease: no two writers

  std::thread device_thread([&] {
    std::mt19937 rng(12345);
    uint64_t grants[WeightGradSlots::kSlotCount] = {0, 0};
    for (int step = 0; step < kSteps; ++step) {
      for (int layer = kLayers - 1; layer >= 0; --layer) {
        maybe_sleep(rng);
        const SlotLease lease = slots.acquire(layer);
        // A slot is granted again only after its release: generation == earlier grants.
        if (lease.slot != layer % 2 || lease.generation != grants[lease.slot]++)
          ++wrong_generations;
        if (held_by_worker[lease.slot].load(std::memory_order_acquire)) ++overlapping_use;
        const int id = step * kLayers + layer;
        for (size_t i = 0; i < kBlockCount; ++i) {
          lease.data[i] = static_cast<float>(id);
          if (i == kBlockCount / 2) maybe_sleep(rng);
        }
        pool.submit([&, lease, id] {
          std::mt19937 worker_rng(static_cast<uint32_t>(id));
          held_by_worker[lease.slot].store(true, std::memory_order_release);
          maybe_sleep(worker_rng);
          std::vector<float> host(kBlockCount);
          device->copy_to_host(host.data(), lease.data, kBlockCount);
          maybe_sleep(worker_rng);  // the device must still not touch the slot
          for (size_t i = 0; i < kBlockCount; ++i) {
            if (host[i] != static_cast<float>(id) || lease.data[i] != static_cast<float>(id)) {
              ++wrong_values;
              break;
            }
          }
          ++seen[id];
          held_by_worker[lease.slot].store(false, std::memory_order_release);
          slots.release(lease);
        });
      }
    }
  });
  device_thread.join();
  pool.wait_idle();

  EXPECT_EQ(wrong_values.load(), 0);
  EXPECT_EQ(wrong_generations.load(), 0);
  EXPECT_EQ(overlapping_use.load(), 0);
  for (int id = 0; id < kSteps * kLayers; ++id) ASSERT_EQ(seen[id], 1) << "lease " << id;
  // With delays on both sides the device must have waited for the CPU at least once.
  EXPECT_GT(slots.stalls(), 0u);
}

TEST(WeightGradSlots, StaleReleaseIsAnError) {
  std::unique_ptr<Device> device = make_cpu_device();
  WeightGradSlots slots(*device, 8, device->memory_kind());
  const SlotLease lease = slots.acquire(3);
  EXPECT_EQ(lease.slot, 1);
  slots.release(lease);
  EXPECT_THROW(slots.release(lease), Error);
  const SlotLease next = slots.acquire(1);
  EXPECT_EQ(next.slot, 1);
  EXPECT_EQ(next.generation, lease.generation + 1);
  slots.release(next);
}

TEST(CpuUpdatePool, UrgentTasksStartBeforeWaitingOnes) {
  CpuUpdatePool pool(1);
  std::mutex gate;
  // The first task keeps the only worker busy until the rest is queued.
  std::unique_lock hold(gate);
  std::atomic<bool> first_started{false};
  std::vector<std::string> order;  // written by the one worker only
  pool.submit([&] {
    first_started = true;
    std::lock_guard wait(gate);
    order.push_back("first");
  });
  while (!first_started) std::this_thread::yield();
  pool.submit([&] { order.push_back("update 1"); });
  pool.submit([&] { order.push_back("update 2"); });
  pool.submit_urgent([&] { order.push_back("consume 1"); });
  pool.submit([&] { order.push_back("update 3"); });
  pool.submit_urgent([&] { order.push_back("consume 2"); });
  hold.unlock();
  pool.wait_idle();
  const std::vector<std::string> expected = {"first",    "consume 1", "consume 2",
                                             "update 1", "update 2",  "update 3"};
  EXPECT_EQ(order, expected);
}

TEST(CpuUpdatePool, RethrowsATaskError) {
  CpuUpdatePool pool(2);
  std::atomic<int> ran{0};
  pool.submit([&] { ++ran; });
  pool.submit([] { fail("worker failed"); });
  pool.submit([&] { ++ran; });
  EXPECT_THROW(pool.wait_idle(), Error);
  EXPECT_EQ(ran.load(), 2);
  pool.wait_idle();  // the error is reported once
}

}  // namespace
}  // namespace layup
