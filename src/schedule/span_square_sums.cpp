// Per-span sums of squares written by the device; see span_square_sums.h.
#include "schedule/span_square_sums.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace layup {

namespace {

constexpr double kNotTaken = std::numeric_limits<double>::quiet_NaN();

}  // namespace

PlannedAllocation SpanSquareSums::buffer(size_t spans, DeviceKinds kinds) {
  return {MemorySide::kHost, TensorClass::kScratch, kinds.host_copy, spans * sizeof(double),
          "per-span gradient sums of squares the device writes"};
}

SpanSquareSums::SpanSquareSums(Device& device, size_t spans)
    : device_(device), sums_(device.allocate(buffer(spans, device.kinds()))) {
  std::fill_n(reinterpret_cast<double*>(sums_.data()), spans, kNotTaken);
}

void SpanSquareSums::start(size_t index, const float* device_grad, size_t count) {
  device_.start_sum_of_squares(device_grad, count, reinterpret_cast<double*>(sums_.data()) + index);
}

double SpanSquareSums::take(size_t index) {
  return std::exchange(reinterpret_cast<double*>(sums_.data())[index], kNotTaken);
}

}  // namespace layup
