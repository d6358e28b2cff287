// What the `offload` and `layup` schedules share: the compute copy of the weights in the device's
// memory (what forward and backward read), and on the host the fp32 master weights, the gradient
// accumulated over micro-batches and the AdamW moments, all in layout order. A checkpoint is the
// host side (export_tensors); the device copy is refreshed from it span by span after each
// update (update_span) and whole on import.
//
// The derived schedules decide how a step's gradient reaches host_grads_ and when each span is
// updated; evaluation, logits and checkpoint state work the same in both.
#pragma once

#include <memory>
#include <vector>

#include "schedule/schedule.h"

namespace layup {

class HostOptimizerSchedule : public Schedule {
 public:
  float evaluate(const TokenBatch& batch) override;
  const float* forward_logits(const TokenBatch& batch) override;
  OptimizerTensors export_tensors() const override;
  void import_tensors(const OptimizerTensors& tensors) override;

 protected:
  HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                        const ParameterLayout& layout);

  ParameterPointers device_params() const { return layout_.pointers<const float>(params_.data()); }
  float* span_grads(const Span& span) { return host_grads_.data() + span.offset; }

  // AdamW on one span of the master weights with its accumulated gradient, then the span's new
  // weights into the device copy; traced as "adamw ..." on trace_track. Spans are disjoint, so
  // different threads may update different spans at once.
  void update_span(const Span& span, const AdamWStep& adamw, int trace_track);

  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const ParameterLayout layout_;
  DeviceBuffer params_;  // the compute copy the device reads
  // fp32 master weights, the accumulated gradient and the AdamW moments, in layout order.
  std::vector<float> host_params_, host_grads_, host_m_, host_v_;
};

}  // namespace layup
