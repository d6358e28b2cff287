// How a host-updated span's gradient reaches its AdamW in the layup schedule (see
// docs/schedules.md), chosen once from ScheduleOptions: added into the whole-model host
// accumulator (host_gradient: clipping and accumulation need it), copied into a pinned landing
// buffer (the host cannot read the device's memory), or read in place (it can: the CPU backend,
// or gradients placed in pinned or managed memory).
//
// The consumer thread calls take() once per micro-batch and span, in backward order; a route
// gives the device its memory back (a gradient slot) as soon as it is done with it, or, reading
// in place, once the update has read it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "schedule/host_gradient.h"
#include "schedule/release_once.h"

namespace layup {

// One micro-batch's gradient of a span in device memory, as the backward left it.
struct GradientSource {
  size_t index = 0;                      // the span, in layout.spans() order
  const float* data = nullptr;           // laid out like the span
  const DeviceFence* written = nullptr;  // passed once `data` is complete
  int slot = -1;  // the gradient slot holding it; -1: a head span's own buffer
  // Gives `data` back to the device (a slot's release; null for a head span, whose buffer the
  // next backward_head overwrites only after the consumer is done with it).
  std::shared_ptr<ReleaseOnce> give_back;
};

// Where a span's update reads its gradient (host-readable, laid out like the span).
struct RoutedGradient {
  const float* grads = nullptr;
  // After the last of several micro-batches: the sum of squares the host took of their sum. With
  // one micro-batch the sum is the device's (SpanSquareSums), which the caller takes.
  double host_sum_sq = 0.0;
  // Runs once the update has read `grads` (or when the last holder drops it): gives the memory
  // back. Null where nothing needs giving back.
  std::shared_ptr<ReleaseOnce> read_done;
};

class GradientRoute {
 public:
  virtual ~GradientRoute() = default;
  // Consumer: hands one micro-batch's gradient on, once `source.written` has passed. `grads` is
  // meaningful after the last micro-batch only.
  virtual RoutedGradient take(const GradientSource& source, bool first, bool last) = 0;
  // Where the step's gradient of span `index` stays until the next step begins (the host
  // accumulator), for an update submitted once the norm is known; null for a route whose memory
  // goes back once the update has read it (the update then runs as the route hands it on).
  virtual const float* kept(size_t index) const = 0;
};

// The route: into `accumulator` when there is one; else in place when the weight gradients live
// in memory the host reads (grads_kind is not device memory); else through pinned landing
// buffers, one per slot and one per span in `head_spans` (the host-updated head spans).
std::unique_ptr<GradientRoute> make_gradient_route(HostGradient* accumulator, Device& device,
                                                   const ParameterLayout& layout,
                                                   MemoryKind grads_kind,
                                                   const std::vector<size_t>& head_spans);

// What that route allocates (the accumulator is the HostGradient's, listed with it): the landing
// buffers, or nothing.
BufferList gradient_route_buffers(bool accumulator, const ParameterLayout& layout,
                                  MemoryKind grads_kind, DeviceKinds kinds,
                                  const std::vector<size_t>& head_spans);

}  // namespace layup
