// MicroBatchGradients: the device buffers a micro-batch's backward writes.
#include "schedule/micro_batch_gradients.h"

#include "core/error.h"

namespace layup {

namespace {

PlannedAllocation whole_buffer(const ParameterLayout& layout, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.total_count() * sizeof(float), "whole-model gradient of one micro-batch"};
}

PlannedAllocation head_buffer(const ParameterLayout& layout, MemoryKind kind, size_t index) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.spans()[index].count * sizeof(float),
          index == 0 ? "embeddings' gradient (complete only at the end of backward)"
                     : "final norm's gradient"};
}

}  // namespace

MicroBatchGradients::MicroBatchGradients(Device& device, const ParameterLayout& layout, bool whole,
                                         MemoryKind kind)
    : layout_(layout) {
  if (whole) {
    whole_ = device.allocate(whole_buffer(layout, kind));
    return;
  }
  embeddings_ = device.allocate(head_buffer(layout, kind, 0));
  final_norm_ = device.allocate(head_buffer(layout, kind, layout.spans().size() - 1));
  slots_.emplace(device, layout.block().count, kind);
}

BufferList MicroBatchGradients::buffers(const ParameterLayout& layout, bool whole,
                                        MemoryKind kind) {
  if (whole) return {whole_buffer(layout, kind)};
  BufferList list = {head_buffer(layout, kind, 0),
                     head_buffer(layout, kind, layout.spans().size() - 1)};
  append(list, WeightGradSlots::buffers(layout.block().count, kind));
  return list;
}

float* MicroBatchGradients::head(size_t index) const {
  if (whole()) return whole_.data() + layout_.spans()[index].offset;
  return index == 0 ? embeddings_.data() : final_norm_.data();
}

float* MicroBatchGradients::block(int layer) const {
  LAYUP_CHECK(whole(), "internal error: block ", layer,
              "'s gradient has no place of its own here: it goes through a slot");
  return whole_.data() + layout_.spans()[1 + static_cast<size_t>(layer)].offset;
}

WeightGradSlots& MicroBatchGradients::slots() {
  LAYUP_CHECK(slots_.has_value(),
              "internal error: this schedule keeps the whole-model gradient, not gradient slots");
  return *slots_;
}

}  // namespace layup
