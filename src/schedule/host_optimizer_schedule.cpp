// HostOptimizerSchedule: the state and the operations `offload` and `layup` share.
#include "schedule/host_optimizer_schedule.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// Sum-of-squares chunks a worker adds and squares at a time (1 MiB): small enough that the piece
// is still in the worker's cache when it is squared.
constexpr size_t kPassChunks = 4;
// Sum-of-squares chunks the staging buffer holds (16 MiB): one transfer per piece of a later
// micro-batch's gradient, long enough to run at the interconnect's full rate.
constexpr size_t kStagingChunks = 64;

}  // namespace

HostOptimizerSchedule::HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend,
                                             std::unique_ptr<Device> device,
                                             const ParameterLayout& layout,
                                             const ScheduleOptions& options)
    : backend_(std::move(backend)),
      device_(std::move(device)),
      layout_(layout),
      weights_in_place_(options.weights_in_place),
      host_gradient_(options.host_gradient),
      speculative_clip_(options.speculative_clip),
      host_params_(allocate_state(options, TensorClass::kMasterWeights)),
      host_m_(allocate_state(options, TensorClass::kOptimizerMoments)),
      host_v_(allocate_state(options, TensorClass::kOptimizerMoments)),
      device_sums_(*device_, layout.spans().size()) {
  LAYUP_CHECK(options.cpu_workers >= 0, "--cpu-workers must be at least 1 (got ",
              options.cpu_workers, ")");
  HostAdamWOptions adamw_options;
  adamw_options.workers = options.cpu_workers;
  host_adamw_ = std::make_unique<HostAdamW>(adamw_options);

  if (!weights_in_place_)
    params_ = allocate_placed(*device_, options, layout.total_count(), TensorClass::kWeights,
                              MemorySide::kDevice);
  if (speculative_clip_) {
    spare_params_ = allocate_state(options, TensorClass::kMasterWeights);
    spare_m_ = allocate_state(options, TensorClass::kOptimizerMoments);
    spare_v_ = allocate_state(options, TensorClass::kOptimizerMoments);
  }
  if (host_gradient_) {
    host_grads_ = device_->allocate_host(layout.total_count(), TensorClass::kWeightGrads);
    size_t largest_span = 0;
    for (const Span& span : layout_.spans()) largest_span = std::max(largest_span, span.count);
    staging_ = device_->allocate_host(std::min(largest_span, kStagingChunks * kSumOfSquaresChunk),
                                      TensorClass::kWeightGrads);
  }
}

DeviceBuffer HostOptimizerSchedule::allocate_state(const ScheduleOptions& options,
                                                   TensorClass tensor_class) {
  return allocate_placed(*device_, options, layout_.total_count(), tensor_class, MemorySide::kHost);
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

double HostOptimizerSchedule::accumulate_gradient(const DeviceFence& written,
                                                  const float* device_grad, size_t index,
                                                  bool first, bool last,
                                                  const std::function<void()>& copied) {
  LAYUP_CHECK(host_gradient_, "this schedule keeps no host gradient to accumulate into");
  const Span& span = layout_.spans()[index];
  const size_t count = span.count;
  const size_t chunks = sum_of_squares_chunks(count);
  const bool host_sums = last && !first;  // one micro-batch: the device took the sum
  std::vector<double> chunk_sums(host_sums ? chunks : 0, 0.0);
  float* accumulated = span_grads(span);
  const auto element_pass = [&](size_t first_chunk, size_t end_chunk,
                                const std::function<void(size_t, size_t)>& combine) {
    chunked_pass(accumulated, count, first_chunk, end_chunk, combine,
                 host_sums ? chunk_sums.data() : nullptr);
  };

  if (first) {
    land_gradient(written, device_grad, index);
    if (copied) copied();
    // One micro-batch: the gradient as the backward wrote it, as gpu mode uses it, and the sum
    // of squares the device took: no host pass at all (host bandwidth is what the step is bound
    // by).
    if (last) return device_sum_of_squares(index);
    // 0 + g in place: what adding into a zeroed accumulator gives (a -0 gradient becomes +0), as
    // gpu mode's sum over micro-batches starts.
    element_pass(0, chunks, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) accumulated[i] = 0.0f + accumulated[i];
    });
  } else {
    std::lock_guard lock(accumulate_mutex_);
    const size_t piece_chunks = std::max<size_t>(1, staging_.count() / kSumOfSquaresChunk);
    for (size_t c = 0; c < chunks; c += piece_chunks) {
      const size_t piece_begin = c * kSumOfSquaresChunk;
      const size_t c_end = std::min(chunks, c + piece_chunks);
      const size_t piece_end = std::min(count, c_end * kSumOfSquaresChunk);
      const float* staged = staging_.data();
      device_->copy_to_host_after(written, staging_.data(), device_grad + piece_begin,
                                  piece_end - piece_begin);
      // One float add per element in micro-batch order, as every mode accumulates.
      element_pass(c, c_end, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) accumulated[i] += staged[i - piece_begin];
      });
    }
    if (copied) copied();
  }
  return host_sums ? add_chunk_sums(chunk_sums.data(), chunks) : 0.0;
}

void HostOptimizerSchedule::land_gradient(const DeviceFence& written, const float* device_grad,
                                          size_t index) {
  LAYUP_CHECK(host_gradient_, "this schedule keeps no host gradient to land into");
  const Span& span = layout_.spans()[index];
  device_->copy_to_host_after(written, span_grads(span), device_grad, span.count);
}

void HostOptimizerSchedule::chunked_pass(const float* squared, size_t count, size_t first_chunk,
                                         size_t end_chunk,
                                         const std::function<void(size_t, size_t)>& combine,
                                         double* chunk_sums) {
  // Whole chunks per worker, so that each chunk's sum is one worker's chain in index order.
  host_adamw_->run_on_workers([&](int worker, int workers) {
    const size_t n = end_chunk - first_chunk;
    const size_t my_end = first_chunk + n * (worker + 1) / workers;
    for (size_t c = first_chunk + n * worker / workers; c < my_end; c += kPassChunks) {
      const size_t c_end = std::min(my_end, c + kPassChunks);
      if (combine) combine(c * kSumOfSquaresChunk, std::min(count, c_end * kSumOfSquaresChunk));
      if (chunk_sums != nullptr) chunk_sums_of_squares(squared, count, c, c_end, chunk_sums);
    }
  });
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
