// WeightRing: the device slots streamed blocks compute from (docs/memory.md, "Streamed weights").
// The last ScheduleOptions::streamed_blocks blocks the host updates keep no compute copy on the
// device: block l computes from slot l % slots(), fixed for the run, so the pointers the backend
// is given for it never change. The step plan's "weights in" tasks fill a slot from the host
// before each forward and backward that needs it, on the ring's own thread (the to-device lane),
// while the device computes the block before.
#pragma once

#include <cstddef>
#include <functional>
#include <future>
#include <optional>
#include <vector>

#include "backend/device.h"
#include "memory/planned_allocation.h"
#include "model/parameter_layout.h"
#include "schedule/cpu_update_pool.h"
#include "schedule/schedule.h"

namespace layup {

class TraceRecorder;

class WeightRing {
 public:
  // Per span whether its weights are streamed: the last `streamed_blocks` blocks `sites` updates
  // on the host (UpdateSite::kHost; empty `sites`: every span on the host). A device-updated
  // block's AdamW writes its weights where they lie, and a disk block's come from its staging.
  static std::vector<char> streamed_spans(const ParameterLayout& layout,
                                          const std::vector<UpdateSite>& sites,
                                          int streamed_blocks);
  // Slots in the ring: stream_slots, but no more than the blocks streamed.
  static int slot_count(const ScheduleOptions& options);
  // The ring's buffer on the device (none where nothing is streamed): slot_count() slots of one
  // block's fp32 weights.
  static std::optional<PlannedAllocation> buffer(const ParameterLayout& layout,
                                                 const ScheduleOptions& options, DeviceKinds kinds);

  WeightRing(Device& device, const ParameterLayout& layout, const ScheduleOptions& options);

  bool streams(size_t span) const { return span < streamed_.size() && streamed_[span] != 0; }
  // Where block span `span` computes from (streams(span) must hold).
  float* slot(size_t span) const;

  // Starts filling span `span`'s slot from `source` (host memory laid out like the span) on the
  // ring's thread, once `ready` has returned there (the span's update of the last step landed on
  // the host), the copy itself once `after` has passed on the device (the slot's last reader).
  // The future holds the fence the copy lands by (Device::copy_to_device_after), or what failed;
  // the slot's next reader orders its work after that fence (Device::order_after).
  using Filled = std::shared_future<std::shared_ptr<const DeviceFence>>;
  Filled fill_async(size_t span, const float* source, std::shared_ptr<const DeviceFence> after,
                    std::function<void()> ready);
  // The same on the calling thread, after all device work issued so far, and ordered before all
  // device work issued after it.
  void fill_now(size_t span, const float* source);
  // Records each fill as "weights in block l" on `track` of `recorder` (null: stop).
  void set_trace(TraceRecorder* recorder, int track);

 private:
  std::shared_ptr<const DeviceFence> fill(size_t span, const float* source,
                                          const DeviceFence* after);

  Device& device_;
  const ParameterLayout layout_;
  const std::vector<char> streamed_;
  const int slots_;
  size_t slot_floats_ = 0;
  DeviceBuffer ring_;
  TraceRecorder* trace_ = nullptr;
  int track_ = 0;
  CpuUpdatePool thread_{1};  // last: it stops before what its fills use goes
};

}  // namespace layup
