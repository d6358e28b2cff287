// HostOptimizerSchedule: the state and the operations `offload` and `layup` share.
#include "schedule/host_optimizer_schedule.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "trace/trace_recorder.h"

namespace layup {

HostOptimizerSchedule::Buffers HostOptimizerSchedule::buffers(const ParameterLayout& layout,
                                                              const ScheduleOptions& options,
                                                              DeviceKinds kinds) {
  const size_t count = layout.total_count();
  auto host_state = [&](TensorClass tensor_class, std::string what) {
    return placed_buffer(options, kinds, count, tensor_class, MemorySide::kHost, std::move(what));
  };
  Buffers buffers;
  buffers.master = host_state(TensorClass::kMasterWeights,
                              options.weights_in_place
                                  ? "fp32 master weights (the device computes with them in place)"
                                  : "fp32 master weights");
  buffers.m = host_state(TensorClass::kOptimizerMoments, "AdamW m");
  buffers.v = host_state(TensorClass::kOptimizerMoments, "AdamW v");
  buffers.span_sums = SpanSquareSums::buffer(layout.spans().size(), kinds);
  if (!options.weights_in_place)
    buffers.weights =
        placed_buffer(options, kinds, count, TensorClass::kWeights, MemorySide::kDevice,
                      "fp32 copy of the weights the device computes with");
  if (options.speculative_clip) {
    buffers.spare_master =
        host_state(TensorClass::kMasterWeights,
                   "spare fp32 master weights (speculative clipping writes the new state here)");
    buffers.spare_m = host_state(TensorClass::kOptimizerMoments, "spare AdamW m");
    buffers.spare_v = host_state(TensorClass::kOptimizerMoments, "spare AdamW v");
  }
  if (options.host_gradient) buffers.gradient = HostGradient::buffers(layout, kinds);
  return buffers;
}

BufferList HostOptimizerSchedule::Buffers::list() const {
  BufferList list = {master, m, v, span_sums};
  for (const std::optional<PlannedAllocation>& buffer : {weights, spare_master, spare_m, spare_v})
    if (buffer) list.push_back(*buffer);
  if (gradient) append(list, gradient->list());
  return list;
}

HostOptimizerSchedule::HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend,
                                             std::unique_ptr<Device> device,
                                             const ParameterLayout& layout,
                                             const ScheduleOptions& options)
    : backend_(std::move(backend)),
      device_(std::move(device)),
      layout_(layout),
      weights_in_place_(options.weights_in_place),
      speculative_clip_(options.speculative_clip),
      device_sums_(*device_, layout.spans().size()) {
  LAYUP_CHECK(options.cpu_workers >= 0, "--cpu-workers must be at least 1 (got ",
              options.cpu_workers, ")");
  const Buffers listed = buffers(layout, options, device_->kinds());
  host_params_ = device_->allocate(listed.master);
  host_m_ = device_->allocate(listed.m);
  host_v_ = device_->allocate(listed.v);
  if (listed.weights) params_ = device_->allocate(*listed.weights);
  if (listed.spare_master) {
    spare_params_ = device_->allocate(*listed.spare_master);
    spare_m_ = device_->allocate(*listed.spare_m);
    spare_v_ = device_->allocate(*listed.spare_v);
  }
  HostAdamWOptions adamw_options;
  adamw_options.workers = options.cpu_workers;
  host_adamw_ = std::make_unique<HostAdamW>(adamw_options);
  if (listed.gradient)
    host_gradient_ = std::make_unique<HostGradient>(*device_, layout_, *host_adamw_, device_sums_);
}

void HostOptimizerSchedule::set_trace(TraceRecorder* recorder) {
  Schedule::set_trace(recorder);
  to_device_track_ = recorder != nullptr ? recorder->track("to device") : 0;
  worker_tracks_.clear();
  if (recorder != nullptr)
    for (int worker = 0; worker < host_adamw_->worker_count(); ++worker)
      worker_tracks_.push_back(recorder->track("cpu worker " + std::to_string(worker)));
}

float HostOptimizerSchedule::forward_pass(const TokenBatch& batch) {
  return backend_->forward(device_params(), batch);
}

float HostOptimizerSchedule::evaluate(const TokenBatch& batch) {
  return forward_pass(batch);
}

const float* HostOptimizerSchedule::forward_logits(const TokenBatch& batch) {
  forward_pass(batch);
  return backend_->logits();
}

OptimizerTensors HostOptimizerSchedule::export_tensors() const {
  finish_updates();
  return OptimizerTensors{{host_params_.begin(), host_params_.end()},
                          {host_m_.begin(), host_m_.end()},
                          {host_v_.begin(), host_v_.end()}};
}

void HostOptimizerSchedule::import_tensors(const OptimizerTensors& tensors) {
  const size_t n = layout_.total_count();
  LAYUP_CHECK(
      tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
      "model state has ", tensors.params.size(), " parameters but the model needs ", n);
  finish_updates();
  std::copy(tensors.params.begin(), tensors.params.end(), host_params_.begin());
  std::copy(tensors.adam_m.begin(), tensors.adam_m.end(), host_m_.begin());
  std::copy(tensors.adam_v.begin(), tensors.adam_v.end(), host_v_.begin());
  if (!weights_in_place_) device_->copy_to_device(params_.data(), host_params_.data(), n);
}

std::string HostOptimizerSchedule::cpu_adamw_report() const {
  finish_updates();  // count every update of the steps so far
  return host_adamw_->report();
}

double HostOptimizerSchedule::cpu_adamw_rate() const {
  finish_updates();
  return host_adamw_->rate_params_per_s();
}

void HostOptimizerSchedule::start_device_sum_of_squares(size_t index, const float* device_grad) {
  device_sums_.start(index, device_grad, layout_.spans()[index].count);
}

double HostOptimizerSchedule::device_sum_of_squares(size_t index) {
  return device_sums_.take(index);
}

HostOptimizerSchedule::OptimizerState HostOptimizerSchedule::spare_state() {
  LAYUP_CHECK(speculative_clip_, "this schedule keeps no spare optimizer state");
  return {spare_params_.data(), spare_m_.data(), spare_v_.data()};
}

void HostOptimizerSchedule::promote_spare_state() {
  LAYUP_CHECK(speculative_clip_, "this schedule keeps no spare optimizer state");
  std::swap(host_params_, spare_params_);
  std::swap(host_m_, spare_m_);
  std::swap(host_v_, spare_v_);
}

void HostOptimizerSchedule::refresh_device_weights(const Span& span) {
  if (!weights_in_place_)
    device_->copy_to_device(params_.data() + span.offset, host_params_.data() + span.offset,
                            span.count);
}

void HostOptimizerSchedule::update_span(const Span& span, const float* grads,
                                        const OptimizerState& from, const OptimizerState& to,
                                        const AdamWStep& adamw, int trace_track,
                                        std::function<void()> landed) {
  float* master = to.params + span.offset;
  TraceRecorder* const trace = trace_ != nullptr && trace_->recording() ? trace_ : nullptr;
  {
    TraceSpan traced(trace_, trace_track, adamw_trace_name(span.kind), span.layer);
    // With a trace, each worker's share on its own track, under the same name.
    std::vector<double> share_start_us(worker_tracks_.size(), 0.0);
    std::string name = adamw_trace_name(span.kind);
    if (span.kind == SpanKind::kBlock) {
      // Appended piece by piece: `" " + std::to_string(...)` trips GCC 12's -Wrestrict.
      name += ' ';
      name += std::to_string(span.layer);
    }
    HostAdamW::ShareHook on_share;
    if (trace != nullptr && !worker_tracks_.empty())
      on_share = [&](int worker, bool started) {
        if (started) {
          share_start_us[worker] = trace->now_us();
          return;
        }
        try {
          trace->add_span(worker_tracks_[worker], name, share_start_us[worker], trace->now_us());
        } catch (...) {  // a lost trace span is not worth failing the update for
        }
      };
    const size_t at = span.offset;
    const AdamWBuffers buffers{from.params + at, grads,     from.m + at, from.v + at,
                               to.params + at,   to.m + at, to.v + at};
    host_adamw_->update_span(layout_, span, buffers, adamw, on_share);
  }
  if (weights_in_place_) {  // the device reads the master weights: nothing to send
    landed();
    return;
  }
  // The transfer is traced from its start to its landing on the "to device" track.
  const double start_us = trace != nullptr ? trace->now_us() : 0.0;
  device_->copy_to_device_async(params_.data() + span.offset, master, span.count,
                                [trace, track = to_device_track_, start_us, kind = span.kind,
                                 layer = span.layer, landed = std::move(landed)] {
                                  if (trace != nullptr)
                                    trace->add_span(track, weights_trace_name(kind, layer),
                                                    start_us, trace->now_us());
                                  landed();
                                });
}

}  // namespace layup
