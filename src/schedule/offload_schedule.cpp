// The `offload` mode (ZeRO-Offload style), a baseline: the device computes forward and the full
// backward into a whole-model gradient buffer; the gradient is copied to the host span by span,
// the CPU clips and runs AdamW on the host's fp32 master weights and moments, and the new
// weights are copied back. Nothing overlaps.
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
#include "schedule/schedule.h"

namespace layup {

namespace {

class OffloadSchedule final : public Schedule {
 public:
  OffloadSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                  const ParameterLayout& layout)
      : backend_(std::move(backend)),
        device_(std::move(device)),
        layout_(layout),
        params_(device_->allocate(layout.total_count())),
        grads_(device_->allocate(layout.total_count())),
        host_params_(layout.total_count(), 0.0f),
        host_grads_(layout.total_count(), 0.0f),
        host_staging_(layout.total_count(), 0.0f),
        host_m_(layout.total_count(), 0.0f),
        host_v_(layout.total_count(), 0.0f) {}

  std::string name() const override { return "offload"; }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = layout_.pointers<const float>(params_.data());
    const GradientPointers grads = layout_.pointers(grads_.data());
    std::fill(host_grads_.begin(), host_grads_.end(), 0.0f);

    const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
    double loss_sum = 0.0;
    for (const TokenBatch& batch : micro_batches) {
      device_->fill_zero(grads_.data(), grads_.count());
      loss_sum += backend_->forward(params, batch);
      backend_->backward_head(params, grads.final_norm, grads.embeddings, loss_scale);
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer)
        backend_->backward_block(layer, params, grads.blocks[layer]);
      backend_->backward_embeddings(params, grads.embeddings);
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
    for (const Span& span : layout_.spans())
      sum_sq += sum_of_squares(host_grads_.data() + span.offset, span.count);
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    for (const Span& span : layout_.spans()) {
      adamw_update_span(layout_, span, host_params_.data() + span.offset,
                        host_grads_.data() + span.offset, host_m_.data() + span.offset,
                        host_v_.data() + span.offset, adamw);
      device_->copy_to_device(params_.data() + span.offset, host_params_.data() + span.offset,
                              span.count);
    }
    stats.applied = true;
    return stats;
  }

  float evaluate(const TokenBatch& batch) override {
    return backend_->forward(layout_.pointers<const float>(params_.data()), batch);
  }

  const float* forward_logits(const TokenBatch& batch) override {
    backend_->forward(layout_.pointers<const float>(params_.data()), batch);
    return backend_->logits();
  }

  OptimizerTensors export_tensors() const override {
    return OptimizerTensors{host_params_, host_m_, host_v_};
  }

  void import_tensors(const OptimizerTensors& tensors) override {
    const size_t n = layout_.total_count();
    LAYUP_CHECK(
        tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
        "model state has ", tensors.params.size(), " parameters but the model needs ", n);
    host_params_ = tensors.params;
    host_m_ = tensors.adam_m;
    host_v_ = tensors.adam_v;
    device_->copy_to_device(params_.data(), host_params_.data(), n);
  }

 private:
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  ParameterLayout layout_;
  DeviceBuffer params_, grads_;  // the compute copy and one micro-batch's gradient
  // Host side: fp32 master weights, the accumulated gradient, one micro-batch's copy, moments.
  std::vector<float> host_params_, host_grads_, host_staging_, host_m_, host_v_;
};

}  // namespace

std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout) {
  return std::make_unique<OffloadSchedule>(std::move(backend), std::move(device), layout);
}

}  // namespace layup
