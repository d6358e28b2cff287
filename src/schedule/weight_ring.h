// WeightRing: the device slots streamed blocks compute from (docs/memory.md, "Streamed weights").
// The last ScheduleOptions::streamed_blocks blocks the host updates keep no compute copy on the
// device: block l computes from slot l % slots(), fixed for the run, so the pointers the backend
// is given for it never change. A slot holds one block's weights as the device computes with them:
// fp32, or bf16 where host-updated weights land in the backend's bf16 compute copy
// (ScheduleOptions::weights_land_in_compute_copy), the slot then being that span's copy. The step
// plan's "weights in" tasks fill a slot from the host before each forward and backward that needs
// it, on the ring's own thread (the to-device lane), while the device computes the block before.
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
  // Per span whether its weights are streamed: the last `streamed_blocks` blocks whose update the
  // host runs (UpdateSite kHost, kStaged or kDisk; empty `sites`: every span on the host). A
  // device-updated block's AdamW writes its weights where they lie.
  static std::vector<char> streamed_spans(const ParameterLayout& layout,
                                          const std::vector<UpdateSite>& sites,
                                          int streamed_blocks);
  // Per span whether its bf16 compute copy is its ring slot, where weights land in the compute
  // copy (the backend then leaves the span out of its own weights region); else empty.
  static std::vector<char> compute_copies_in_ring(const ParameterLayout& layout,
                                                  const ScheduleOptions& options);
  // Slots in the ring: stream_slots, but no more than the blocks streamed.
  static int slot_count(const ScheduleOptions& options);
  // Bytes of one weight as the device computes with it: 2 (bf16) where weights land in the
  // compute copy, else 4.
  static size_t element_bytes(const ScheduleOptions& options);
  // The ring's buffer on the device (none where nothing is streamed): slot_count() slots of one
  // block's weights, each starting 256-byte aligned.
  static std::optional<PlannedAllocation> buffer(const ParameterLayout& layout,
                                                 const ScheduleOptions& options, DeviceKinds kinds);

  WeightRing(Device& device, const ParameterLayout& layout, const ScheduleOptions& options);

  bool streams(size_t span) const { return span < streamed_.size() && streamed_[span] != 0; }
  // Where block span `span` computes from (streams(span) must hold), element_bytes() a weight.
  void* slot(size_t span) const;
  size_t element_bytes() const { return element_bytes_; }

  // Starts filling span `span`'s slot from `source` (host memory laid out like the span, in the
  // slot's type) on the ring's thread, once `ready` has returned there (the span's update of the
  // last step landed on the host), the copy itself once `after` has passed on the device (the
  // slot's last reader).
  // The future holds the fence the copy lands by (Device::copy_to_device_after), or what failed;
  // the slot's next reader orders its work after that fence (Device::order_after).
  using Filled = std::shared_future<std::shared_ptr<const DeviceFence>>;
  Filled fill_async(size_t span, const void* source, std::shared_ptr<const DeviceFence> after,
                    std::function<void()> ready);
  // The same on the calling thread, after all device work issued so far, and ordered before all
  // device work issued after it.
  void fill_now(size_t span, const void* source);
  // Records each fill as "weights in block l" on `track` of `recorder` (null: stop).
  void set_trace(TraceRecorder* recorder, int track);

 private:
  std::shared_ptr<const DeviceFence> fill(size_t span, const void* source,
                                          const DeviceFence* after);

  Device& device_;
  const ParameterLayout layout_;
  const std::vector<char> streamed_;
  const int slots_;
  const size_t element_bytes_;
  size_t slot_bytes_ = 0;  // a slot's stride in the ring
  DeviceBuffer ring_;
  TraceRecorder* trace_ = nullptr;
  int track_ = 0;
  CpuUpdatePool thread_{1};  // last: it stops before what its fills use goes
};

}  // namespace layup
