// What the `offload` and `layup` schedules share: the compute copy of the weights in the device's
// memory (what forward and backward read), and on the host the fp32 master weights, the gradient
// accumulated over micro-batches and the AdamW moments, all in layout order. A checkpoint is the
// host side (export_tensors); the device copy is refreshed from it span by span after each
// update (update_span) and whole on import.
//
// Host memory: the master weights, the gradient accumulator and a staging buffer come from the
// device's allocate_host (pinned on CUDA), because the device copies into and out of them; the
// moments only the CPU touches are plain host memory. All of it is recorded in the accountant.
//
// Copies: a span's gradient leaves device memory in one transfer straight into its accumulator
// (the first micro-batch) or through the staging buffer (later ones), once the fence of the
// backward that wrote it has passed; a span's new weights go back in one asynchronous transfer
// that runs while the workers update the next span.
//
// The CPU side runs on one engine, HostAdamW (optim/host_adamw.h): worker threads pinned to
// cores that split every pass over a span between them: adding a gradient into the accumulator,
// its sum of squares, AdamW. Each pass is one call, so a span's update uses every worker however
// the schedule orders spans.
//
// The derived schedules decide how a step's gradient reaches host_grads_ and when each span is
// updated; evaluation, logits and checkpoint state work the same in both.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
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
  double cpu_adamw_rate() const override;
  // Also names the track of the weight copies to the device ("to device").
  void set_trace(TraceRecorder* recorder) override;

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

  // Adds one micro-batch's gradient of `span` (device memory laid out like the span, complete once
  // `written` has passed) into the span's host accumulator, and calls `copied` (when given) as soon
  // as the gradient is out of device memory, so the device may overwrite it. first: one transfer
  // straight into the accumulator, which then becomes 0 + g element by element (bit for bit what
  // zeroing and adding gives: a -0 gradient becomes +0); later micro-batches go through the
  // staging buffer and are added, one float add per element. last: also returns the sum of squares
  // of the accumulated span (else 0), grouped as sum_of_squares groups it. The element passes are
  // split over the HostAdamW workers in whole chunks of the sum of squares (optim/grad_norm.h).
  // Any thread may call it; calls are serialized.
  double accumulate_gradient(const DeviceFence& written, const float* device_grad, const Span& span,
                             bool first, bool last, const std::function<void()>& copied = {});

  // AdamW on one span of the master weights with its accumulated gradient, split over the
  // HostAdamW workers and traced as "adamw ..." on trace_track; then starts the transfer of the
  // span's new weights into the device copy and returns. `landed` runs when they are there (on
  // whatever thread Device::copy_to_device_async says; it must not block or throw). Any thread may
  // call it; the caller must not let anything read the span's device copy before `landed`.
  void update_span(const Span& span, const AdamWStep& adamw, int trace_track,
                   std::function<void()> landed);

  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const ParameterLayout layout_;
  DeviceBuffer params_;  // the compute copy the device reads
  // fp32 master weights and the accumulated gradient (allocate_host), and the AdamW moments, in
  // layout order.
  DeviceBuffer host_params_, host_grads_;
  AccountedHostBuffer host_m_, host_v_;
  std::unique_ptr<HostAdamW> host_adamw_;

 private:
  // Later micro-batches' gradients land here, a piece at a time (allocate_host). Used only inside
  // accumulate_gradient, whose calls are serialized by accumulate_mutex_.
  DeviceBuffer staging_;
  std::mutex accumulate_mutex_;
  int to_device_track_ = 0;  // "to device" in trace_
};

}  // namespace layup
