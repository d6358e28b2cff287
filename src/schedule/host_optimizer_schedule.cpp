// HostOptimizerSchedule: the state and the operations `offload` and `layup` share.
#include "schedule/host_optimizer_schedule.h"

#include <algorithm>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// A worker copies a gradient out this many sum-of-squares chunks at a time (1 MiB): large enough
// that a copy from a GPU is one efficient transfer, small enough that the staged piece is still
// in the worker's cache when it is added and squared.
constexpr size_t kStagingChunks = 4;

}  // namespace

HostOptimizerSchedule::HostOptimizerSchedule(std::unique_ptr<ModelBackend> backend,
                                             std::unique_ptr<Device> device,
                                             const ParameterLayout& layout, int cpu_workers)
    : backend_(std::move(backend)),
      device_(std::move(device)),
      layout_(layout),
      params_(device_->allocate(layout.total_count(), TensorClass::kWeights)),
      host_params_(layout.total_count(), 0.0f),
      host_grads_(layout.total_count(), 0.0f),
      host_m_(layout.total_count(), 0.0f),
      host_v_(layout.total_count(), 0.0f) {
  LAYUP_CHECK(cpu_workers >= 0, "--cpu-workers must be at least 1 (got ", cpu_workers, ")");
  HostAdamWOptions options;
  options.workers = cpu_workers;
  host_adamw_ = std::make_unique<HostAdamW>(options);

  size_t largest_span = 0;
  for (const Span& span : layout_.spans()) largest_span = std::max(largest_span, span.count);
  const size_t staging_count = std::min(largest_span, kStagingChunks * kSumOfSquaresChunk);
  worker_staging_.resize(host_adamw_->worker_count());
  host_adamw_->run_on_workers(
      [&](int worker, int) { worker_staging_[worker].assign(staging_count, 0.0f); });
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
  return OptimizerTensors{host_params_, host_m_, host_v_};
}

void HostOptimizerSchedule::import_tensors(const OptimizerTensors& tensors) {
  const size_t n = layout_.total_count();
  LAYUP_CHECK(
      tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
      "model state has ", tensors.params.size(), " parameters but the model needs ", n);
  finish_updates();
  host_params_ = tensors.params;
  host_m_ = tensors.adam_m;
  host_v_ = tensors.adam_v;
  device_->copy_to_device(params_.data(), host_params_.data(), n);
}

std::string HostOptimizerSchedule::cpu_adamw_report() const {
  finish_updates();  // count every update of the steps so far
  return host_adamw_->report();
}

double HostOptimizerSchedule::accumulate_gradient(const float* device_grad, const Span& span,
                                                  bool first, bool last) {
  const size_t count = span.count;
  const size_t chunks = sum_of_squares_chunks(count);
  std::vector<double> chunk_sums(last ? chunks : 0, 0.0);
  float* accumulated = span_grads(span);
  host_adamw_->run_on_workers([&](int worker, int workers) {
    // Whole chunks per worker, so that each chunk's sum is one worker's chain in index order.
    const size_t first_chunk = chunks * worker / workers;
    const size_t end_chunk = chunks * (worker + 1) / workers;
    float* staging = worker_staging_[worker].data();
    for (size_t c = first_chunk; c < end_chunk; c += kStagingChunks) {
      const size_t piece_end_chunk = std::min(end_chunk, c + kStagingChunks);
      const size_t begin = c * kSumOfSquaresChunk;
      const size_t end = std::min(count, piece_end_chunk * kSumOfSquaresChunk);
      device_->copy_to_host(staging, device_grad + begin, end - begin);
      float* into = accumulated + begin;
      // One float add per element in micro-batch order, as every mode accumulates. 0 + g, not g:
      // exactly what adding into a zeroed accumulator gives (a -0 gradient becomes +0).
      if (first) {
        for (size_t i = 0; i < end - begin; ++i) into[i] = 0.0f + staging[i];
      } else {
        for (size_t i = 0; i < end - begin; ++i) into[i] += staging[i];
      }
      if (last) chunk_sums_of_squares(accumulated, count, c, piece_end_chunk, chunk_sums.data());
    }
  });
  return last ? add_chunk_sums(chunk_sums.data(), chunks) : 0.0;
}

void HostOptimizerSchedule::update_span(const Span& span, const AdamWStep& adamw, int trace_track) {
  TraceSpan traced(trace_, trace_track, adamw_trace_name(span.kind), span.layer);
  float* master = host_params_.data() + span.offset;
  host_adamw_->update_span(layout_, span, master, span_grads(span), host_m_.data() + span.offset,
                           host_v_.data() + span.offset, adamw);
  float* device_copy = params_.data() + span.offset;
  host_adamw_->for_each_worker_share(span.count, [&](size_t begin, size_t end) {
    device_->copy_to_device(device_copy + begin, master + begin, end - begin);
  });
}

}  // namespace layup
