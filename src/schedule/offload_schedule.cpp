// The `offload` mode (ZeRO-Offload style), a baseline: the device computes forward and the full
// backward into a whole-model gradient buffer; the gradient is copied to the host span by span
// (one transfer per span into pinned memory on CUDA), the CPU clips and runs AdamW on the host's
// fp32 master weights and moments, and the new weights are copied back, one transfer per span.
// The phases do not overlap one another; within the update phase a span's weights travel while
// the next span is updated, and the step returns when the last span's have landed. The host side
// runs on the HostAdamW workers (HostUpdatedModel), called from the calling thread, and is
// traced on the track "cpu workers".
// Micro-batches are summed on the host, in the order every mode uses (docs/schedules.md,
// "Micro-batch accumulation").
#include <algorithm>
#include <cmath>
#include <latch>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/host_updated_model.h"
#include "schedule/mode_schedules.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// Conventional offload always brings the whole gradient to the host.
ScheduleOptions with_host_gradient(ScheduleOptions options) {
  options.host_gradient = true;
  return options;
}

class OffloadSchedule final : public Schedule {
 public:
  OffloadSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                  const ParameterLayout& layout, const ScheduleOptions& options)
      : layout_(layout),
        model_(std::move(backend), std::move(device), layout, with_host_gradient(options)),
        grads_(
            model_.device().allocate(gradient_buffer(layout, options, model_.device().kinds()))) {}

  static PlannedAllocation gradient_buffer(const ParameterLayout& layout,
                                           const ScheduleOptions& options, DeviceKinds kinds) {
    return placed_buffer(options, kinds, layout.total_count(), TensorClass::kWeightGrads,
                         MemorySide::kDevice, "whole-model gradient of one micro-batch");
  }

  std::string name() const override { return "offload"; }
  const ParameterLayout& layout() const override { return layout_; }

  void set_trace(TraceRecorder* recorder) override {
    trace_ = recorder;
    device_track_ = device_track(recorder);
    model_.set_trace(recorder);
    host_track_ = recorder != nullptr ? recorder->track("cpu workers") : 0;
  }

  // Nothing is in flight between steps: the model's state is read and written as it is.
  float evaluate(const TokenBatch& batch) override {
    return model_.backend().forward(model_.device_params(), batch);
  }
  const float* forward_logits(const TokenBatch& batch) override {
    evaluate(batch);
    return model_.backend().logits();
  }
  void export_span(size_t index, const SpanState& out) const override {
    model_.export_span(index, out);
  }
  void import_span(size_t index, const ConstSpanState& in) override {
    model_.import_span(index, in);
  }
  std::string cpu_adamw_report() const override { return model_.cpu_adamw_report(); }
  double cpu_adamw_rate() const override { return model_.cpu_adamw_rate(); }
  std::string storage_report() const override { return model_.storage_report(); }
  DiskTraffic disk_traffic() const override { return model_.disk_traffic(); }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = model_.device_params();
    const GradientPointers grads = layout_.pointers(grads_.data());
    const std::vector<Span>& spans = layout_.spans();
    // Per span: the sum of squares of its accumulated gradient, known after the last micro-batch.
    std::vector<double> span_sum_sq(spans.size(), 0.0);

    // The global batch is every rank's micro-batches: each one's share of the mean loss.
    const size_t global_micro_batches = micro_batches.size() * model_.rank_count();
    const float loss_scale = 1.0f / static_cast<float>(global_micro_batches);
    double loss_sum = 0.0;
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      // The backward overwrites grads_ (ModelBackend): no zeroing.
      {
        TraceSpan traced(trace_, device_track_, "forward");
        loss_sum += model_.backend().forward(params, micro_batches[k]);
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_head");
        model_.backend().backward_head(params, grads.final_norm, grads.embeddings, loss_scale);
      }
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer) {
        TraceSpan traced(trace_, device_track_, "backward_block", layer);
        model_.backend().backward_block(layer, params, grads.blocks[layer]);
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_embeddings");
        model_.backend().backward_embeddings(params, grads.embeddings);
      }
      // Copy out and accumulate; after the last micro-batch, each span's sum of squares too (the
      // device's, with one micro-batch, taken before the copies).
      if (micro_batches.size() == 1)
        for (size_t s = 0; s < spans.size(); ++s)
          model_.start_device_sum_of_squares(s, grads_.data() + spans[s].offset);
      const std::shared_ptr<const DeviceFence> backward_done = model_.device().fence();
      TraceSpan traced(trace_, host_track_, "consume gradients");
      for (size_t s = 0; s < spans.size(); ++s) {
        span_sum_sq[s] =
            model_.host_gradient()->accumulate(*backward_done, grads_.data() + spans[s].offset, s,
                                               k == 0, k + 1 == micro_batches.size());
      }
    }

    if (model_.ranks() != nullptr) {
      // Every rank's gradient summed in rank order, span by span, and the sums of squares taken
      // again of the sums (docs/parallel.md); the losses alike.
      TraceSpan traced(trace_, host_track_, "sum_over_ranks");
      for (size_t s = 0; s < spans.size(); ++s) span_sum_sq[s] = model_.sum_gradient_over_ranks(s);
      loss_sum = model_.ranks()->sum_in_rank_order(loss_sum);
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / global_micro_batches);
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    for (double span_sum : span_sum_sq) sum_sq += span_sum;
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    // Every span's weights on the device before the step returns. `landed` outlives every copy
    // that was started, even when a later span's update throws.
    const auto span_count = static_cast<std::ptrdiff_t>(spans.size());
    std::latch landed(span_count);
    std::ptrdiff_t started = 0;
    try {
      for (size_t s = 0; s < spans.size(); ++s) {
        model_.update_span(s, model_.host_gradient()->span(s), adamw, host_track_,
                           [&landed] { landed.count_down(); });
        ++started;
      }
    } catch (...) {
      landed.count_down(span_count - started);
      landed.wait();
      throw;
    }
    landed.wait();
    stats.applied = true;
    return stats;
  }

 private:
  const ParameterLayout layout_;
  TraceRecorder* trace_ = nullptr;
  int device_track_ = 0;  // "GPU" in trace_
  HostUpdatedModel model_;
  DeviceBuffer grads_;  // one micro-batch's whole gradient, on the device
  int host_track_ = 0;  // "cpu workers" in trace_
};

}  // namespace

BufferList offload_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                    DeviceKinds kinds) {
  BufferList list = HostUpdatedModel::buffers(layout, with_host_gradient(options), kinds).list();
  list.push_back(OffloadSchedule::gradient_buffer(layout, options, kinds));
  return list;
}

std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout,
                                                const ScheduleOptions& options) {
  return std::make_unique<OffloadSchedule>(std::move(backend), std::move(device), layout, options);
}

}  // namespace layup
