// The `gpu` mode: the whole training step on one device, the baseline every mode is measured
// against. On the CPU backend "the device" is the host; the step is the same.
#include <cmath>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/schedule.h"

namespace layup {

namespace {

class GpuSchedule final : public Schedule {
 public:
  GpuSchedule(std::unique_ptr<ModelBackend> backend, const ParameterLayout& layout)
      : backend_(std::move(backend)),
        layout_(layout),
        params_(layout.total_count(), 0.0f),
        grads_(layout.total_count(), 0.0f),
        adam_m_(layout.total_count(), 0.0f),
        adam_v_(layout.total_count(), 0.0f) {}

  std::string name() const override { return "gpu"; }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = layout_.pointers<const float>(params_.data());
    const GradientPointers grads = layout_.pointers(grads_.data());
    std::fill(grads_.begin(), grads_.end(), 0.0f);

    const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
    double loss_sum = 0.0;
    for (const TokenBatch& batch : micro_batches) {
      loss_sum += backend_->forward(params, batch);
      backend_->backward_head(params, grads.final_norm, grads.embeddings, loss_scale);
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer)
        backend_->backward_block(layer, params, grads.blocks[layer]);
      backend_->backward_embeddings(params, grads.embeddings);
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / micro_batches.size());
    stats.grad_norm = std::sqrt(sum_of_squares(grads_.data(), grads_.size()));
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    for (const Span& span : layout_.spans()) {
      adamw_update_span(layout_, span, params_.data() + span.offset, grads_.data() + span.offset,
                        adam_m_.data() + span.offset, adam_v_.data() + span.offset, adamw);
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

  OptimizerTensors export_tensors() const override { return {params_, adam_m_, adam_v_}; }

  void import_tensors(const OptimizerTensors& tensors) override {
    const size_t n = layout_.total_count();
    LAYUP_CHECK(tensors.params.size() == n && tensors.adam_m.size() == n &&
                    tensors.adam_v.size() == n,
                "model state has ", tensors.params.size(), " parameters but the model needs ", n);
    params_ = tensors.params;
    adam_m_ = tensors.adam_m;
    adam_v_ = tensors.adam_v;
  }

 private:
  std::unique_ptr<ModelBackend> backend_;
  ParameterLayout layout_;
  std::vector<float> params_, grads_, adam_m_, adam_v_;
};

}  // namespace

std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            const ParameterLayout& layout) {
  return std::make_unique<GpuSchedule>(std::move(backend), layout);
}

}  // namespace layup
