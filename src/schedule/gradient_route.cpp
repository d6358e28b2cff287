// The three gradient routes of the layup schedule.
#include "schedule/gradient_route.h"

#include <array>
#include <condition_variable>
#include <mutex>

#include "core/error.h"
#include "schedule/weight_grad_slots.h"

namespace layup {

namespace {

// Into the host accumulator: the slot goes back once its contents are on the host.
class AccumulatorRoute final : public GradientRoute {
 public:
  explicit AccumulatorRoute(HostGradient& accumulator) : accumulator_(accumulator) {}

  RoutedGradient take(const GradientSource& source, bool first, bool last) override {
    const auto give_back = [&] {
      if (source.give_back) source.give_back->now();
    };
    RoutedGradient routed{accumulator_.span(source.index), 0.0, nullptr};
    if (first && last) {
      accumulator_.land(*source.written, source.data, source.index);  // the device took the sum
      give_back();
    } else {
      routed.host_sum_sq = accumulator_.accumulate(*source.written, source.data, source.index,
                                                   first, last, give_back);
    }
    return routed;
  }

  const float* kept(size_t index) const override { return accumulator_.span(index); }

 private:
  HostGradient& accumulator_;
};

// Through pinned landing buffers: a slot's gradient is copied into its slot's landing buffer
// (once the update that read the last one is done with it) and the slot goes back at once, so on
// a discrete GPU block l's copy runs beside block l+1's AdamW. A head span has a buffer of its
// own, free again by the next step's backward: the next forward waits for the update that reads it.
class LandingRoute final : public GradientRoute {
 public:
  LandingRoute(Device& device, const ParameterLayout& layout, const std::vector<size_t>& head_spans)
      : device_(device), layout_(layout), head_landing_(layout.spans().size()) {
    for (DeviceBuffer& landing : slot_landing_)
      landing = device.allocate_host(layout.block().count, TensorClass::kWeightGrads);
    for (const size_t index : head_spans)
      head_landing_[index] =
          device.allocate_host(layout.spans()[index].count, TensorClass::kWeightGrads);
  }

  RoutedGradient take(const GradientSource& source, bool, bool) override {
    RoutedGradient routed;
    float* landing = nullptr;
    if (source.slot >= 0) {
      acquire(source.slot);  // the update of the block two above has read it
      routed.read_done =
          std::make_shared<ReleaseOnce>([this, slot = source.slot] { release(slot); });
      landing = slot_landing_[source.slot].data();
    } else {
      landing = head_landing_[source.index].data();
      LAYUP_CHECK(landing != nullptr, "span ", source.index, " has no landing buffer");
    }
    device_.copy_to_host_after(*source.written, landing, source.data,
                               layout_.spans()[source.index].count);
    if (source.give_back) source.give_back->now();
    routed.grads = landing;
    return routed;
  }

  const float* kept(size_t) const override { return nullptr; }

 private:
  // A slot's landing buffer, for the consumer's copy: waits until no update reads it.
  void acquire(int slot) {
    std::unique_lock lock(mutex_);
    freed_.wait(lock, [&] { return !busy_[slot]; });
    busy_[slot] = true;
  }
  void release(int slot) {
    {
      std::lock_guard lock(mutex_);
      busy_[slot] = false;
    }
    freed_.notify_all();
  }

  Device& device_;
  const ParameterLayout& layout_;
  std::array<DeviceBuffer, WeightGradSlots::kSlotCount> slot_landing_;
  std::vector<DeviceBuffer> head_landing_;  // per span; allocated for the host-updated head spans
  // Whether an update still reads a slot's landing buffer.
  std::mutex mutex_;
  std::condition_variable freed_;
  std::array<bool, WeightGradSlots::kSlotCount> busy_{};
};

// In place: the update reads the slot itself, which goes back once the update has read it.
class InPlaceRoute final : public GradientRoute {
 public:
  explicit InPlaceRoute(Device& device) : device_(device) {}

  RoutedGradient take(const GradientSource& source, bool, bool) override {
    device_.wait_for(*source.written);
    return {source.data, 0.0, source.give_back};
  }

  const float* kept(size_t) const override { return nullptr; }

 private:
  Device& device_;
};

}  // namespace

std::unique_ptr<GradientRoute> make_gradient_route(HostGradient* accumulator, Device& device,
                                                   const ParameterLayout& layout,
                                                   MemoryKind grads_kind,
                                                   const std::vector<size_t>& head_spans) {
  if (accumulator != nullptr) return std::make_unique<AccumulatorRoute>(*accumulator);
  if (grads_kind != MemoryKind::kDevice) return std::make_unique<InPlaceRoute>(device);
  return std::make_unique<LandingRoute>(device, layout, head_spans);
}

}  // namespace layup
