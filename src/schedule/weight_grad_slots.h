// The double buffer of the `layup` schedule: two gradient slots, each one transformer block span,
// and the handshake that lets the device thread overwrite a slot only after a CPU worker has
// copied it out.
//
// Block l's backward writes slot l % 2. Protocol, one lease per block:
//
//   device thread                          CPU worker
//   lease = acquire(l)   (waits: free)
//   backward into lease.data (overwrites)
//   hand the lease to a worker  ------->   copy lease.data to the host
//                                          release(lease)   (slot free again)
//   acquire(l - 2)       (waits for that release)
//
// Each slot carries a generation counter, bumped by every release. A lease remembers the
// generation it was granted in, and release() checks it, so a slot released twice, or released
// by the wrong lease, is an error instead of a silent overwrite.
//
// Memory ordering: all slot state is guarded by one mutex. The worker's reads of the slot happen
// before its release() (program order), release() unlocks the mutex, and the device thread's
// acquire() locks it before returning, so the worker's reads happen-before the device's next
// writes to that slot (no data race, no early overwrite). In the other direction the device's
// writes reach the worker through the mutex of the queue that carries the lease (CpuUpdatePool).
// On a GPU the device writes are asynchronous: the device thread hands the worker a fence
// (Device::fence) with the lease, and the worker copies the slot out once it has passed.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "backend/device.h"

namespace layup {

// The right to write (device thread) and then read (one CPU worker) one slot.
struct SlotLease {
  int slot = -1;            // 0 or 1
  int layer = -1;           // the block whose gradient the slot holds
  uint64_t generation = 0;  // the slot's generation when it was granted
  float* data = nullptr;    // one block span, in device memory
};

class WeightGradSlots {
 public:
  static constexpr int kSlotCount = 2;

  // Two slots of block_count floats each, in memory of `kind` (the device's own, or where the
  // placement of the weight gradients says: pinned memory the host reads in place, ...).
  WeightGradSlots(Device& device, size_t block_count, MemoryKind kind);

  // One slot's buffer, and the slots' list.
  static PlannedAllocation slot_buffer(size_t block_count, MemoryKind kind);
  static BufferList buffers(size_t block_count, MemoryKind kind) {
    return BufferList(kSlotCount, slot_buffer(block_count, kind));
  }

  size_t block_count() const { return block_count_; }

  // Device thread: waits until slot layer % 2 has been released by its last holder, then grants
  // it. The slot's contents are whatever the last holder left (the backward overwrites them).
  SlotLease acquire(int layer);

  // The holder (a CPU thread; the device thread for a block it keeps): the slot's contents are no
  // longer needed; the device may overwrite it. Throws layup::Error when the lease is not the
  // slot's current one.
  void release(const SlotLease& lease);

  // How many acquire() calls had to wait for a release (the device stalled on the CPU).
  uint64_t stalls() const;

 private:
  struct SlotState {
    DeviceBuffer buffer;
    bool leased = false;
    uint64_t generation = 0;
  };

  size_t block_count_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::array<SlotState, kSlotCount> slots_;
  uint64_t stalls_ = 0;
};

}  // namespace layup
