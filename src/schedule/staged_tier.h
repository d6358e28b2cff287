// StagedTier: the blocks whose optimizer state the host keeps but the DEVICE updates
// (UpdateSite::kStaged, --optimizer-placement staged:S). Their fp32 master weights and moments stay
// in the host's packed store, in the run's optimizer state kind, exactly as a host-updated
// block's; an update copies the block's gradient and state into a staging slot in device memory,
// runs the device's AdamW there (Device::adamw_update_span_state, which also writes the bf16
// compute copy where the weights land in it) and copies the new master weights and moments back
// into the host's store. The disk tier one level up (disk_tier.h) stages a block's state through
// host memory for the CPU the same way. See docs/schedules.md ("Staged blocks").
//
// Slots: `slots` of them (two by default), each for a part of at most kStagingPartElements of a
// block (a whole block where it is smaller): a gradient, the moments, where the span has no fp32
// copy on the device to update in place its master weights, and where a staged block is streamed
// (its weights not kept on the device) the bf16 weights its update writes for the host's copy. A
// block's update goes through part by part; a slot is free once its part's state has landed back
// on the host, so the next part's copies in run beside this part's AdamW and copies out. Where the
// span has an fp32 device copy (the weights the device computes with), the master weights are
// copied into it and updated there: no weight copy of their own back.
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
  // `device` must outlive this.
  StagedTier(Device& device, const ParameterLayout& layout, const ScheduleOptions& options);
  // Waits for the copies still in flight (their handlers refer to this).
  ~StagedTier();
  StagedTier(const StagedTier&) = delete;
  StagedTier& operator=(const StagedTier&) = delete;

  // Whether any span of `options` is staged, and whether span `index` is.
  static bool any(const ScheduleOptions& options);
  static bool staged(const ScheduleOptions& options, size_t index);
  // Whether the slots hold master weights: the staged spans have no fp32 copy on the device (the
  // weights land in the bf16 compute copy, the device computes with the master weights in place,
  // or a staged block is streamed).
  static bool params_in_slot(const ParameterLayout& layout, const ScheduleOptions& options);
  // The most elements of a block one slot holds: 2^25 (128 MiB of fp32 gradient), a multiple of
  // the 8-bit state's blocks, so that two slots of a Llama 3 8B block (218 M parameters, 2.6 GB
  // of gradient, weights and 8-bit moments) take 0.8 GB of the device rather than 5.2 GB.
  static constexpr size_t kStagingPartElements = size_t{1} << 25;
  // The elements a slot holds in `options`' run: the largest staged block's, at most
  // kStagingPartElements.
  static size_t slot_elements(const ParameterLayout& layout, const ScheduleOptions& options);
  // The slots, in device memory: one gradient, one moments, (params_in_slot) one master weights
  // and (a staged block streamed with bf16 weights) one bf16 weights buffer, each of `slots`
  // slots of slot_elements.
  static BufferList buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                            DeviceKinds kinds);

  bool holds(size_t index) const { return index < staged_.size() && staged_[index] != 0; }

  // Where one update reads and writes: the gradient and the state it starts from (host memory
  // laid out like the span; the moments coded as in_buffer lays them out), the state it writes
  // (the same or the spare copy), and on the device the span's fp32 copy to update in place and
  // its bf16 compute copy to write (each may be null); a streamed block's copy of its weights in
  // host memory that the next fills read (`stream_copy`, null where it is not streamed), of
  // `stream_element_bytes` (2: bf16; 4: fp32) a weight.
  struct Update {
    size_t index = 0;
    const float* grads = nullptr;
    const float* from_params = nullptr;
    const float* from_moments = nullptr;
    float* to_params = nullptr;
    float* to_moments = nullptr;
    float* device_params = nullptr;
    void* bf16_weights = nullptr;
    void* stream_copy = nullptr;
    size_t stream_element_bytes = 0;
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
    void* weights = nullptr;  // a streamed block's new bf16 weights; null unless some stream
    bool busy = false;
  };

  // One part's update: elements [first, first + count) of `u`'s span through a free slot.
  // `landed` runs once its copies back are in.
  void update_part(const Update& u, size_t first, size_t count, const AdamWStep& adamw,
                   std::function<void()> landed);

  // Under mutex_ (dropped while waiting): a free slot, taken.
  size_t take_slot(std::unique_lock<std::mutex>& lock);

  Device& device_;
  const ParameterLayout& layout_;
  const OptimizerStateKind kind_;
  std::vector<char> staged_;  // per span
  size_t slot_elements_ = 0;
  DeviceBuffer grads_, params_, moments_, weights_;
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<int> in_flight_;  // per span: updates whose copies back have not landed
  int copies_in_flight_ = 0;
};

}  // namespace layup
