// The three gradient routes of the layup schedule.
#include "schedule/gradient_route.h"

#include <array>
#include <condition_variable>
#include <mutex>
#include <string>

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
      landing = device.allocate(slot_buffer(layout, device.kinds()));
    for (const size_t index : head_spans)
      head_landing_[index] = device.allocate(head_buffer(layout, device.kinds(), index));
  }

  static PlannedAllocation slot_buffer(const ParameterLayout& layout, DeviceKinds kinds) {
    return {MemorySide::kHost, TensorClass::kWeightGrads, kinds.host_copy,
            layout.block().count * sizeof(float), "landing buffer of a gradient slot"};
  }
  static PlannedAllocation head_buffer(const ParameterLayout& layout, DeviceKinds kinds,
                                       size_t index) {
    return {
        MemorySide::kHost, TensorClass::kWeightGrads, kinds.host_copy,
        layout.spans()[index].count * sizeof(float),
        std::string("landing buffer of the ") +
            (layout.spans()[index].kind == SpanKind::kEmbeddings ? "embeddings'" : "final norm's") +
            " gradient"};
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

enum class RouteKind { kAccumulator, kInPlace, kLanding };

RouteKind route_kind(bool accumulator, MemoryKind grads_kind) {
  if (accumulator) return RouteKind::kAccumulator;
  return grads_kind != MemoryKind::kDevice ? RouteKind::kInPlace : RouteKind::kLanding;
}

}  // namespace

std::unique_ptr<GradientRoute> make_gradient_route(HostGradient* accumulator, Device& device,
                                                   const ParameterLayout& layout,
                                                   MemoryKind grads_kind,
                                                   const std::vector<size_t>& head_spans) {
  switch (route_kind(accumulator != nullptr, grads_kind)) {
    case RouteKind::kAccumulator:
      return std::make_unique<AccumulatorRoute>(*accumulator);
    case RouteKind::kInPlace:
      return std::make_unique<InPlaceRoute>(device);
    case RouteKind::kLanding:
      break;
  }
  return std::make_unique<LandingRoute>(device, layout, head_spans);
}

BufferList gradient_route_buffers(bool accumulator, const ParameterLayout& layout,
                                  MemoryKind grads_kind, DeviceKinds kinds,
                                  const std::vector<size_t>& head_spans) {
  if (route_kind(accumulator, grads_kind) != RouteKind::kLanding) return {};
  BufferList buffers(WeightGradSlots::kSlotCount, LandingRoute::slot_buffer(layout, kinds));
  for (const size_t index : head_spans)
    buffers.push_back(LandingRoute::head_buffer(layout, kinds, index));
  return buffers;
}

}  // namespace layup
