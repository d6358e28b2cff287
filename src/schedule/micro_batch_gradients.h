// Where the device's backward writes one micro-batch's gradient in the schedules that hand it to
// the host: layup's head buffers and two gradient slots the blocks take turns in, or offload's
// whole-model gradient, each span in its own part of it (step_plan.h's GradientTarget).
#pragma once

#include <cstddef>
#include <optional>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "schedule/weight_grad_slots.h"

namespace layup {

class MicroBatchGradients {
 public:
  // whole: one buffer for the whole model; else the two head spans' buffers and the slots.
  MicroBatchGradients(Device& device, const ParameterLayout& layout, bool whole, MemoryKind kind);

  // What it allocates, in memory of `kind`.
  static BufferList buffers(const ParameterLayout& layout, bool whole, MemoryKind kind);

  bool whole() const { return whole_.count() > 0; }
  // A head span's gradient (the embeddings: index 0; the final norm: the last span).
  float* head(size_t index) const;
  // With the whole-model gradient: block `layer`'s part of it.
  float* block(int layer) const;
  // Without it: the slots the blocks take turns in.
  WeightGradSlots& slots();

 private:
  const ParameterLayout layout_;
  DeviceBuffer whole_, embeddings_, final_norm_;
  std::optional<WeightGradSlots> slots_;
};

}  // namespace layup
