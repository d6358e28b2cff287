// StagedTier: the blocks whose optimizer state the host keeps but the DEVICE updates
// (UpdateSite::kStaged, --optimizer-placement staged:S). Their fp32 master weights and moments stay
// in the host's packed store, in the run's optimizer state kind, exactly as a host-updated
// block's; an update copies the block's gradient and state into a staging slot in device memory,
// runs the device's AdamW there (Device::adamw_update_span_state, which also writes the bf16
// compute copy where the weights land in it) and copies the new master weights and moments back
// into the host's store. The disk tier one level up (disk_tier.h) stages a block's state through
// host memory for the CPU the same way. See docs/schedules.md ("Staged blocks").
//
// Slots: `slots` of them (two by default), each a gradient, the moments and, where the span has no
// fp32 copy on the device to update in place, its master weights. A slot is free once its state
// has landed back on the host, so the next block's copies in run beside this block's AdamW and
// copies out. Where the span has an fp32 device copy (the weights the device computes with), the
// master weights are copied into it and updated there: no weight copy of their own back.
//
// Threads: update from one thread at a time (the schedule's staging thread); its copies and AdamW
// run on the device beside the device thread's work (on CUDA: the copies on the copy streams, the
// AdamW on the compute stream once its inputs have landed). `landed` runs once the span's new state
// is on the host (on CUDA on CUDA's callback thread).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "optim/adamw_moments.h"
#include "schedule/schedule.h"

namespace layup {

class StagedTier {
 public:
  // The staged spans of options.update_sites, options.staging_slots slots in `device`'s memory.
  // `params_in_slot`: the staged spans have no fp32 copy on the device (the weights land in the
  // bf16 compute copy, or the device computes with the master weights in place), so each slot
  // holds master weights too. `device` must outlive this.
  StagedTier(Device& device, const ParameterLayout& layout, const ScheduleOptions& options,
             bool params_in_slot);
  // Waits for the copies still in flight (their handlers refer to this).
  ~StagedTier();
  StagedTier(const StagedTier&) = delete;
  StagedTier& operator=(const StagedTier&) = delete;

  // Whether any span of `options` is staged, and whether span `index` is.
  static bool any(const ScheduleOptions& options);
  static bool staged(const ScheduleOptions& options, size_t index);
  // Whether the staged spans' slots hold their master weights (see the constructor).
  static bool params_in_slot(const ScheduleOptions& options);
  // The slots, in device memory: one gradient, one moments and (params_in_slot) one master
  // weights buffer, each of `slots` slots of the largest staged span.
  static BufferList buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                            DeviceKinds kinds);

  bool holds(size_t index) const { return index < staged_.size() && staged_[index] != 0; }

  // Where one update reads and writes: the gradient and the state it starts from (host memory
  // laid out like the span; the moments coded as in_buffer lays them out), the state it writes
  // (the same or the spare copy), and on the device the span's fp32 copy to update in place and
  // its bf16 compute copy to write (each may be null).
  struct Update {
    size_t index = 0;
    const float* grads = nullptr;
    const float* from_params = nullptr;
    const float* from_moments = nullptr;
    float* to_params = nullptr;
    float* to_moments = nullptr;
    float* device_params = nullptr;
    void* bf16_weights = nullptr;
  };
  // Takes a free slot (waiting for one), copies the gradient and state in, and issues the
  // device's AdamW and the copies back; returns once the gradient and the `from` state have been
  // read. `landed` runs once the new state is in `to` (and the device's weights are new): it must
  // not block or throw. A span's update waits first for its last one's copies back.
  void update(const Update& update, const AdamWStep& adamw, std::function<void()> landed);

  // Returns once no copy back is in flight.
  void wait_idle();

 private:
  struct Slot {
    float* grads = nullptr;
    float* params = nullptr;  // null unless params_in_slot
    float* moments = nullptr;
    bool busy = false;
  };

  // Under mutex_ (dropped while waiting): a free slot, taken.
  size_t take_slot(std::unique_lock<std::mutex>& lock);

  Device& device_;
  const ParameterLayout& layout_;
  const OptimizerStateKind kind_;
  std::vector<char> staged_;  // per span
  DeviceBuffer grads_, params_, moments_;
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> in_flight_;  // per span: updates whose copies back have not landed
  int copies_in_flight_ = 0;
};

}  // namespace layup
