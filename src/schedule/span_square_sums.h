// Per span of a layout, the sum of squares the device takes of a span's gradient
// (Device::start_sum_of_squares), for the gradient norm: doubles in host memory the device writes
// (Device::allocate_host, two floats each, listed by buffer()). Every schedule
// that has the device take its norm (gpu, offload, layup) keeps its sums here.
#pragma once

#include <cstddef>

#include "backend/device.h"

namespace layup {

class SpanSquareSums {
 public:
  // `device` must outlive this.
  SpanSquareSums(Device& device, size_t spans);

  // Its one buffer, on a device that hands out `kinds`.
  static PlannedAllocation buffer(size_t spans, DeviceKinds kinds);

  // Starts span `index`'s sum over `count` floats at `device_grad`, in order with the device's
  // work; take() reads it once a fence issued after this call has passed. Call from the thread
  // that issues the device's work.
  void start(size_t index, const float* device_grad, size_t count);
  // That sum. Each read consumes it: a sum read twice, or never started, reads NaN (a step that
  // is not applied, which tests see, rather than an old step's norm).
  double take(size_t index);

 private:
  Device& device_;
  DeviceBuffer sums_;
};

}  // namespace layup
