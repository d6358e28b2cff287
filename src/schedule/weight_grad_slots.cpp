// WeightGradSlots: two gradient slots and the device/CPU handshake (see the header).
#include "schedule/weight_grad_slots.h"

#include "core/error.h"

namespace layup {

PlannedAllocation WeightGradSlots::slot_buffer(size_t block_count, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind, block_count * sizeof(float),
          "a block gradient slot (two: a double buffer)"};
}

WeightGradSlots::WeightGradSlots(Device& device, size_t block_count, MemoryKind kind)
    : block_count_(block_count) {
  for (SlotState& slot : slots_) slot.buffer = device.allocate(slot_buffer(block_count, kind));
}

SlotLease WeightGradSlots::acquire(int layer) {
  LAYUP_CHECK(layer >= 0, "gradient slot asked for block ", layer);
  const int index = layer % kSlotCount;
  std::unique_lock lock(mutex_);
  SlotState& slot = slots_[index];
  if (slot.leased) {
    ++stalls_;
    released_.wait(lock, [&] { return !slot.leased; });
  }
  slot.leased = true;
  return SlotLease{index, layer, slot.generation, slot.buffer.data()};
}

void WeightGradSlots::release(const SlotLease& lease) {
  LAYUP_CHECK(lease.slot >= 0 && lease.slot < kSlotCount, "release of gradient slot ", lease.slot);
  {
    std::lock_guard lock(mutex_);
    SlotState& slot = slots_[lease.slot];
    LAYUP_CHECK(slot.leased && slot.generation == lease.generation, "gradient slot ", lease.slot,
                " released by a stale lease (generation ", lease.generation, ", slot at ",
                slot.generation, slot.leased ? ", leased)" : ", free)");
    slot.leased = false;
    ++slot.generation;
  }
  released_.notify_all();
}

uint64_t WeightGradSlots::stalls() const {
  std::lock_guard lock(mutex_);
  return stalls_;
}

}  // namespace layup
