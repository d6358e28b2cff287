// What the `offload` and `layup` schedules share: the compute copy of the weights in the device's
// memory (what forward and backward read), and on the host the fp32 master weights, the gradient
// accumulated over micro-batches and the AdamW moments, all in layout order. A checkpoint is the
// host side (export_tensors); the device copy is refreshed from it span by span after each update
// (update_span) and whole on import. What it allocates with which ScheduleOptions is listed by
// buffers(); what the options mean (weights in place, no host gradient, speculative clipping) is
// written once in docs/schedules.md.
//
// The CPU side runs on one engine, HostAdamW (optim/host_adamw.h), whose pinned workers split
// every pass over a span (adding a gradient into the accumulator, its sum of squares, AdamW), so a
// span's update uses every worker however the derived schedule orders spans. The derived
// schedules decide how a step's gradient reaches the host and when each span is updated.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/host_adamw.h"
#include "schedule/host_gradient.h"
#include "schedule/schedule.h"
#include "schedule/span_square_sums.h"

namespace layup {

class HostOptimizerSchedule : public Schedule {
 public:
  float evaluate(const TokenBatch& batch) override;
  const float* forward_logits(const TokenBatch& batch) override;
  OptimizerTensors export_tensors() const override;
  void import_tensors(const OptimizerTensors& tensors) override;
  std::string cpu_adamw_report() const override;
  double cpu_adamw_rate() const override;
  // Also names the track of the weight copies to the device ("to device") and one track per
  // HostAdamW worker ("cpu worker 0", ...) with its share of every AdamW.
  void set_trace(TraceRecorder* recorder) override;

  // What it allocates with `options` on a device handing out `kinds` (the HostGradient's too).
  struct Buffers {
    PlannedAllocation master, m, v, span_sums;
    std::optional<PlannedAllocation> weights;  // the device copy (none with weights_in_place)
    std::optional<PlannedAllocation> spare_master, spare_m, spare_v;  // speculative_clip
    std::optional<HostGradient::Buffers> gradient;                    // host_gradient
    BufferList list() const;
  };
  static Buffers buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                         DeviceKinds kinds);

 protected:
  // cpu_workers: HostAdamW workers, one per core from the first allowed one (0: every core this
  // process may use).
  HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                        const ParameterLayout& layout, const ScheduleOptions& options);

  // The weights the device computes with: its own copy, or the master weights in place.
  float* device_weights() const { return weights_in_place_ ? host_params_.data() : params_.data(); }
  ParameterPointers device_params() const {
    return layout_.pointers<const float>(device_weights());
  }

  // A forward pass on the device copy. `layup` overrides it to wait, span by span, for updates
  // that are still landing.
  virtual float forward_pass(const TokenBatch& batch);

  // Returns once no update of the host state or the device copy is in flight (`layup` lets
  // updates run past the end of a step); export_tensors and import_tensors call it first.
  virtual void finish_updates() const {}

  // Starts the sum of squares of span `index`'s gradient in device memory, in order with the
  // device's work (Device::start_sum_of_squares); device_sum_of_squares reads it once a fence
  // issued after this call has passed. Call from the thread that issues the device's work.
  void start_device_sum_of_squares(size_t index, const float* device_grad);
  // That sum; each read consumes it (a sum read twice, or never started for this step, reads NaN:
  // a step that is not applied, which tests see, rather than an old step's norm).
  double device_sum_of_squares(size_t index);

  // One copy of the optimizer state: master weights and AdamW moments, in layout order.
  struct OptimizerState {
    float* params;
    float* m;
    float* v;
  };
  // The state export_tensors returns and (with weights_in_place) the device computes with.
  OptimizerState current_state() { return {host_params_.data(), host_m_.data(), host_v_.data()}; }
  // The second copy ScheduleOptions::speculative_clip keeps: a speculative step writes its new
  // state there, leaving the current one to redo the step from.
  OptimizerState spare_state();
  // The spare copy becomes the current state (and the current one the spare), for a step that
  // wrote every span's new state into it. Updates already handed their OptimizerStates keep them.
  void promote_spare_state();

  // AdamW on one span with its gradient `grads` (host-readable, laid out like the span: the
  // accumulator's HostGradient::span, or the gradient where it lies), reading the state in `from`
  // and writing the new state into `to` (the same state: in place; or the spare copy), split over
  // the HostAdamW workers and traced as "adamw ..." on trace_track; then starts the transfer of the
  // span's new weights (from `to`) into the device copy and returns. `landed` runs when they are
  // there (on whatever thread Device::copy_to_device_async says; it must not block or throw), or
  // at once with weights_in_place. Any thread may call it; the caller must not let anything read
  // the span's device weights before `landed`.
  void update_span(const Span& span, const float* grads, const OptimizerState& from,
                   const OptimizerState& to, const AdamWStep& adamw, int trace_track,
                   std::function<void()> landed);
  // In place, on the current state.
  void update_span(const Span& span, const float* grads, const AdamWStep& adamw, int trace_track,
                   std::function<void()> landed) {
    update_span(span, grads, current_state(), current_state(), adamw, trace_track,
                std::move(landed));
  }

  // The span's weights in the device copy from the current master weights, in order with the
  // device's work (nothing to do with weights_in_place).
  void refresh_device_weights(const Span& span);

  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const ParameterLayout layout_;
  const bool weights_in_place_, speculative_clip_;  // ScheduleOptions
  DeviceBuffer params_;  // the compute copy the device reads (none with weights_in_place)
  // fp32 master weights (pinned on CUDA unless placed otherwise) and the AdamW moments (plain
  // host memory unless placed otherwise), in layout order.
  DeviceBuffer host_params_;
  DeviceBuffer host_m_, host_v_;
  // The spare copy of master weights and moments, with speculative_clip only.
  DeviceBuffer spare_params_, spare_m_, spare_v_;
  std::unique_ptr<HostAdamW> host_adamw_;
  // The gradient accumulated over micro-batches (null without ScheduleOptions::host_gradient).
  // It reads device_sums_ but does not touch it when it goes.
  std::unique_ptr<HostGradient> host_gradient_;

 private:
  // Per span, the sum of squares the device took of its gradient (start_device_sum_of_squares).
  SpanSquareSums device_sums_;
  int to_device_track_ = 0;         // "to device" in trace_
  std::vector<int> worker_tracks_;  // "cpu worker i" in trace_, per HostAdamW worker
};

}  // namespace layup
