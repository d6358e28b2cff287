// The `offload` mode (ZeRO-Offload style), a baseline: the device computes forward and the full
// backward into a whole-model gradient buffer; the gradient is copied to the host span by span,
// the CPU clips and runs AdamW on the host's fp32 master weights and moments, and the new
// weights are copied back. Nothing overlaps. The host side runs on the calling thread (each
// AdamW call is parallel inside, with OpenMP), traced as "cpu worker 0".
//
// Accumulation over micro-batches happens on the host: each micro-batch's gradient is computed
// into zeroed device memory, copied out and added to the host's fp32 accumulator, one float add
// per element in micro-batch order. That is the order every mode uses, so the three modes give
// bitwise-identical results on the CPU backend.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/host_optimizer_schedule.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

class OffloadSchedule final : public HostOptimizerSchedule {
 public:
  OffloadSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                  const ParameterLayout& layout)
      : HostOptimizerSchedule(std::move(backend), std::move(device), layout),
        grads_(device_->allocate(layout.total_count())),
        host_staging_(layout.total_count(), 0.0f) {}

  std::string name() const override { return "offload"; }

  void set_trace(TraceRecorder* recorder) override {
    Schedule::set_trace(recorder);
    host_track_ = recorder != nullptr ? recorder->track("cpu worker 0") : 0;
  }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = device_params();
    const GradientPointers grads = layout_.pointers(grads_.data());
    std::fill(host_grads_.begin(), host_grads_.end(), 0.0f);

    const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
    double loss_sum = 0.0;
    for (const TokenBatch& batch : micro_batches) {
      device_->fill_zero(grads_.data(), grads_.count());
      {
        TraceSpan traced(trace_, device_track_, "forward");
        loss_sum += backend_->forward(params, batch);
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_head");
        backend_->backward_head(params, grads.final_norm, grads.embeddings, loss_scale);
      }
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer) {
        TraceSpan traced(trace_, device_track_, "backward_block", layer);
        backend_->backward_block(layer, params, grads.blocks[layer]);
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_embeddings");
        backend_->backward_embeddings(params, grads.embeddings);
      }
      TraceSpan traced(trace_, host_track_, "consume gradients");
      for (const Span& span : layout_.spans()) {
        device_->copy_to_host(host_staging_.data() + span.offset, grads_.data() + span.offset,
                              span.count);
      }
      for (size_t i = 0; i < host_grads_.size(); ++i) host_grads_[i] += host_staging_[i];
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / micro_batches.size());
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    {
      TraceSpan traced(trace_, host_track_, "grad_norm");
      for (const Span& span : layout_.spans())
        sum_sq += sum_of_squares(host_grads_.data() + span.offset, span.count);
    }
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    for (const Span& span : layout_.spans()) update_span(span, adamw, host_track_);
    stats.applied = true;
    return stats;
  }

 private:
  DeviceBuffer grads_;               // one micro-batch's whole gradient, on the device
  std::vector<float> host_staging_;  // one micro-batch's gradient, copied out
  int host_track_ = 0;               // "cpu worker 0" in trace_
};

}  // namespace

std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout) {
  return std::make_unique<OffloadSchedule>(std::move(backend), std::move(device), layout);
}

}  // namespace layup
