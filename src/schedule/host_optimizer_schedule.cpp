// HostOptimizerSchedule: the state and the operations `offload` and `layup` share.
#include "schedule/host_optimizer_schedule.h"

#include "core/error.h"
#include "trace/trace_recorder.h"

namespace layup {

HostOptimizerSchedule::HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend,
                                             std::unique_ptr<Device> device,
                                             const ParameterLayout& layout)
    : backend_(std::move(backend)),
      device_(std::move(device)),
      layout_(layout),
      params_(device_->allocate(layout.total_count())),
      host_params_(layout.total_count(), 0.0f),
      host_grads_(layout.total_count(), 0.0f),
      host_m_(layout.total_count(), 0.0f),
      host_v_(layout.total_count(), 0.0f) {}

float HostOptimizerSchedule::evaluate(const TokenBatch& batch) {
  return backend_->forward(device_params(), batch);
}

const float* HostOptimizerSchedule::forward_logits(const TokenBatch& batch) {
  backend_->forward(device_params(), batch);
  return backend_->logits();
}

OptimizerTensors HostOptimizerSchedule::export_tensors() const {
  return OptimizerTensors{host_params_, host_m_, host_v_};
}

void HostOptimizerSchedule::import_tensors(const OptimizerTensors& tensors) {
  const size_t n = layout_.total_count();
  LAYUP_CHECK(
      tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
      "model state has ", tensors.params.size(), " parameters but the model needs ", n);
  host_params_ = tensors.params;
  host_m_ = tensors.adam_m;
  host_v_ = tensors.adam_v;
  device_->copy_to_device(params_.data(), host_params_.data(), n);
}

void HostOptimizerSchedule::update_span(const Span& span, const AdamWStep& adamw, int trace_track) {
  TraceSpan traced(trace_, trace_track, adamw_trace_name(span.kind), span.layer);
  adamw_update_span(layout_, span, host_params_.data() + span.offset, span_grads(span),
                    host_m_.data() + span.offset, host_v_.data() + span.offset, adamw);
  device_->copy_to_device(params_.data() + span.offset, host_params_.data() + span.offset,
                          span.count);
}

}  // namespace layup
