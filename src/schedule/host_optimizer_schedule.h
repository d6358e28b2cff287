// What the `offload` and `layup` schedules share: the compute copy of the weights in the device's
// memory (what forward and backward read), and on the host the fp32 master weights, the gradient
// accumulated over micro-batches and the AdamW moments, all in layout order. A checkpoint is the
// host side (export_tensors); the device copy is refreshed from it span by span after each
// update (update_span) and whole on import.
//
// The host side runs on one engine, HostAdamW (optim/host_adamw.h): worker threads pinned to
// cores that split every pass over a span between them: copying a gradient out of device memory
// and adding it to the accumulator, its sum of squares, AdamW, and copying the new weights back.
// Each pass is one call, so a span's update uses every worker however the schedule orders spans.
//
// The derived schedules decide how a step's gradient reaches host_grads_ and when each span is
// updated; evaluation, logits and checkpoint state work the same in both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "optim/host_adamw.h"
#include "schedule/schedule.h"

namespace layup {

class HostOptimizerSchedule : public Schedule {
 public:
  float evaluate(const TokenBatch& batch) override;
  const float* forward_logits(const TokenBatch& batch) override;
  OptimizerTensors export_tensors() const override;
  void import_tensors(const OptimizerTensors& tensors) override;
  std::string cpu_adamw_report() const override;

 protected:
  // cpu_workers: HostAdamW workers, one per core from the first allowed one (0: every core this
  // process may use).
  HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                        const ParameterLayout& layout, int cpu_workers);

  ParameterPointers device_params() const { return layout_.pointers<const float>(params_.data()); }
  float* span_grads(const Span& span) { return host_grads_.data() + span.offset; }

  // A forward pass on the device copy. `layup` overrides it to wait, span by span, for updates
  // that are still landing.
  virtual float forward_pass(const TokenBatch& batch);

  // Returns once no update of the host state or the device copy is in flight (`layup` lets
  // updates run past the end of a step); export_tensors and import_tensors call it first.
  virtual void finish_updates() const {}

  // Adds one micro-batch's gradient of `span` (device memory laid out like the span) into the
  // span's host accumulator. Split over the HostAdamW workers in whole chunks of the sum of squares
  // (optim/grad_norm.h): each worker copies its chunks out through a staging buffer of its own and
  // adds them in. first: the accumulator starts from zero (each element becomes 0 + g, bit for bit
  // what zeroing and then adding gives, without the extra pass). last: also returns the sum of
  // squares of the accumulated span (else 0), grouped as sum_of_squares groups it. Any thread may
  // call it; HostAdamW serializes the calls.
  double accumulate_gradient(const float* device_grad, const Span& span, bool first, bool last);

  // AdamW on one span of the master weights with its accumulated gradient, then the span's new
  // weights into the device copy, each split over the HostAdamW workers; traced as "adamw ..." on
  // trace_track, the span ending when the device copy is written. Any thread may call it.
  void update_span(const Span& span, const AdamWStep& adamw, int trace_track);

  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const ParameterLayout layout_;
  DeviceBuffer params_;  // the compute copy the device reads
  // fp32 master weights, the accumulated gradient and the AdamW moments, in layout order.
  std::vector<float> host_params_, host_grads_, host_m_, host_v_;
  std::unique_ptr<HostAdamW> host_adamw_;

 private:
  // One staging buffer per HostAdamW worker (index = worker), touched first by that worker; a
  // worker uses only its own, and only inside a HostAdamW call.
  std::vector<std::vector<float>> worker_staging_;
};

}  // namespace layup
