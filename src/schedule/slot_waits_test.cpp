// What a slot's backward waits for in the layup schedule: only the consume that gives its slot
// back, never the consumes queued after it. Block l's backward into slot l % 2 may start while the
// consumer still copies and adds block l+1's gradient (out of the other slot): that overlap is the
// layup schedule's point. A plan wait meant for offload's next forward (the host's copies of every
// span) once applied to every slot's backward too, which on a GPU stalled the device on each
// block's copy and add; the CPU timing hid it.
//
// Shown without timing: the consumer holds each block's copy out of its slot until the device
// thread has started the next block's backward (bounded: a schedule that waits for the consume
// never gets there, and the hold gives up). The device's side is observed where the backend is
// called and the consumer's where it copies out of a slot, so the order holds whatever the load.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "schedule/forwarding_backend_test_support.h"
#include "schedule/forwarding_device_test_support.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

constexpr int kLayers = 4;
constexpr int kBatch = 2;
constexpr int kSeqLen = 4;
constexpr int kMicroBatches = 3;
constexpr int kSteps = 2;
// Far beyond what the device thread takes between two blocks' backwards, even on a loaded
// machine; only a schedule that waits for the held consume runs into it.
constexpr auto kGiveUp = std::chrono::seconds(5);

ModelConfig tiny_config() {
  return gpt2_config(kLayers, 2, 16, 8, 37);
}

// What the device thread and the consumer tell each other about the gradient slots, keyed by a
// slot's buffer (the block backward writes it; the consumer copies out of it).
class SlotWatch {
 public:
  explicit SlotWatch(size_t block_count) : block_count_(block_count) {}

  // Device thread, as block `layer`'s backward into `slot` starts.
  void backward_starts(int layer, const float* slot) {
    std::lock_guard lock(mutex_);
    ++backwards_started_;
    Slot& s = slots_[slot];
    // The slot's last gradient must be out before the backward overwrites it.
    if (s.layer >= 0 && s.copied < block_count_) ++overwritten_early_;
    s = {layer, backwards_started_, 0, false};
    changed_.notify_all();
  }

  // Consumer, before copying `count` floats from `src`: the first copy out of a slot holding block
  // l >= 1 waits until the device has started block l-1's backward (the next one it runs).
  void before_copy(const float* src, size_t count) {
    std::unique_lock lock(mutex_);
    Slot* s = slot_holding(src);
    if (s == nullptr) return;  // a head span's own buffer
    s->copied += count;
    if (s->held || s->layer < 1 || given_up_ > 0) return;
    s->held = true;
    const uint64_t written_at = s->written_at;
    if (changed_.wait_for(lock, kGiveUp, [&] { return backwards_started_ > written_at; }))
      ++overlapped_;
    else
      ++given_up_;  // once: the rest of the run is not held, so it ends
  }

  int overlapped() const {
    std::lock_guard lock(mutex_);
    return overlapped_;
  }
  int given_up() const {
    std::lock_guard lock(mutex_);
    return given_up_;
  }
  int overwritten_early() const {
    std::lock_guard lock(mutex_);
    return overwritten_early_;
  }

 private:
  struct Slot {
    int layer = -1;           // the block whose gradient it holds
    uint64_t written_at = 0;  // backwards_started_ when its backward started
    size_t copied = 0;        // floats of that gradient copied out so far
    bool held = false;        // the consumer has held a copy of that gradient
  };

  // The slot whose block span holds `p`, else null. Under mutex_.
  Slot* slot_holding(const float* p) {
    for (auto& [data, slot] : slots_)
      if (p >= data && p < data + block_count_) return &slot;
    return nullptr;
  }

  const size_t block_count_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<const float*, Slot> slots_;
  uint64_t backwards_started_ = 0;
  int overlapped_ = 0, given_up_ = 0, overwritten_early_ = 0;
};

// The CPU backend, telling `watch` where each block's backward starts.
class WatchedBackend final : public ForwardingBackend {
 public:
  WatchedBackend(std::unique_ptr<ModelBackend> inner, SlotWatch& watch)
      : ForwardingBackend(std::move(inner)), watch_(watch) {}
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override {
    watch_.backward_starts(layer, block_grad);
    inner().backward_block(layer, params, block_grad);
  }

 private:
  SlotWatch& watch_;
};

// The CPU device, telling `watch` of every copy out of device memory (the consumer's).
class WatchedDevice final : public ForwardingDevice {
 public:
  WatchedDevice(std::unique_ptr<Device> inner, SlotWatch& watch)
      : ForwardingDevice(std::move(inner)), watch_(watch) {}
  void copy_to_host(float* dst, const float* src, size_t count) override {
    watch_.before_copy(src, count);
    inner().copy_to_host(dst, src, count);
  }
  void copy_to_host_after(const DeviceFence& after, float* dst, const float* src,
                          size_t count) override {
    watch_.before_copy(src, count);
    inner().copy_to_host_after(after, dst, src, count);
  }

 private:
  SlotWatch& watch_;
};

// Several micro-batches (the host sums each block's gradient: a copy, then an add), every block
// updated on the host: block l's backward starts while block l+1's consume still runs, and no
// slot is overwritten before its gradient is out.
TEST(LayupSlotWaits, ABlocksBackwardWaitsOnlyForTheConsumeThatFreesItsSlot) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  SlotWatch watch(layout.block().count);
  std::unique_ptr<Schedule> schedule = make_schedule(
      Mode::kLayup,
      std::make_unique<WatchedBackend>(make_cpu_backend(config, kBatch, kSeqLen), watch),
      std::make_unique<WatchedDevice>(make_cpu_device(), watch), layout, {.cpu_workers = 2});
  schedule->import_tensors(fresh_optimizer_tensors(layout, 3));

  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> inputs(kMicroBatches), targets(kMicroBatches);
  std::vector<TokenBatch> batches;
  for (int k = 0; k < kMicroBatches; ++k) {
    for (int i = 0; i < kBatch * kSeqLen; ++i) {
      inputs[k].push_back(static_cast<int32_t>(rng() % config.vocab_size));
      targets[k].push_back(static_cast<int32_t>(rng() % config.vocab_size));
    }
    batches.push_back({inputs[k].data(), targets[k].data(), kBatch, kSeqLen});
  }
  for (int step = 0; step < kSteps; ++step) {
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-3f;
    settings.adamw.t = step + 1;
    // Clipping: the blocks' updates wait for the norm, so the consumer does nothing but consume.
    settings.clip_max_norm = 1.0f;
    EXPECT_TRUE(schedule->step(batches, settings).applied) << "step " << step;
  }
  schedule->export_tensors();  // every update has landed

  EXPECT_EQ(watch.given_up(), 0)
      << "a block's backward waited for the consume of the block after it (the other slot's)";
  // Every block above block 0, every micro-batch of every step, overlapped its consume.
  EXPECT_EQ(watch.overlapped(), kSteps * kMicroBatches * (kLayers - 1));
  EXPECT_EQ(watch.overwritten_early(), 0) << "a slot was overwritten before its gradient was out";
}

}  // namespace
}  // namespace layup
