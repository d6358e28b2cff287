// The `gpu` mode: the whole training step on one device, the baseline every mode is measured
// against. On the CPU backend "the device" is the host; the step is the same.
//
// The three modes must give bitwise-identical results on the CPU backend, so this mode uses the
// same float arithmetic as `offload` and `layup`: the global norm is the sum of per-span sums of
// squares added in layout order, and with several micro-batches each micro-batch's gradient is
// computed into zeroed memory and then added to the accumulator with one float add per element,
// in micro-batch order (Device::add, on the device). Letting the backend accumulate into the same
// buffer would round differently: its kernels add inside their sums, e.g. GEMM with beta = 1.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/schedule.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

class GpuSchedule final : public Schedule {
 public:
  GpuSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
              const ParameterLayout& layout, const ScheduleOptions& options)
      : backend_(std::move(backend)),
        device_(std::move(device)),
        layout_(layout),
        options_(options),
        params_(allocate(TensorClass::kMasterWeights)),
        grads_(allocate(TensorClass::kWeightGrads)),
        adam_m_(allocate(TensorClass::kOptimizerMoments)),
        adam_v_(allocate(TensorClass::kOptimizerMoments)) {}

  std::string name() const override { return "gpu"; }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = layout_.pointers<const float>(params_.data());
    const GradientPointers grads = layout_.pointers(grads_.data());
    const bool accumulate = micro_batches.size() > 1;
    if (accumulate) {
      if (accumulated_.count() == 0) accumulated_ = allocate(TensorClass::kWeightGrads);
      device_->fill_zero(accumulated_.data(), accumulated_.count());
    }

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
      if (accumulate) device_->add(accumulated_.data(), grads_.data(), grads_.count());
    }
    // The update reads the gradient from grads_; swapping the buffers avoids a copy.
    if (accumulate) std::swap(grads_, accumulated_);

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / micro_batches.size());
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    {
      TraceSpan traced(trace_, device_track_, "grad_norm");
      for (const Span& span : layout_.spans())
        sum_sq += device_->sum_of_squares(grads_.data() + span.offset, span.count);
    }
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    for (const Span& span : layout_.spans()) {
      TraceSpan traced(trace_, device_track_, adamw_trace_name(span.kind), span.layer);
      device_->adamw_update_span(layout_, span, params_.data() + span.offset,
                                 grads_.data() + span.offset, adam_m_.data() + span.offset,
                                 adam_v_.data() + span.offset, adamw);
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
    const size_t n = layout_.total_count();
    OptimizerTensors tensors{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
    device_->copy_to_host(tensors.params.data(), params_.data(), n);
    device_->copy_to_host(tensors.adam_m.data(), adam_m_.data(), n);
    device_->copy_to_host(tensors.adam_v.data(), adam_v_.data(), n);
    return tensors;
  }

  void import_tensors(const OptimizerTensors& tensors) override {
    const size_t n = layout_.total_count();
    LAYUP_CHECK(
        tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
        "model state has ", tensors.params.size(), " parameters but the model needs ", n);
    device_->copy_to_device(params_.data(), tensors.params.data(), n);
    device_->copy_to_device(adam_m_.data(), tensors.adam_m.data(), n);
    device_->copy_to_device(adam_v_.data(), tensors.adam_v.data(), n);
  }

 private:
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  // A whole-model buffer of `tensor_class` where the placement puts it (device memory by default).
  DeviceBuffer allocate(TensorClass tensor_class) {
    return allocate_placed(*device_, options_, layout_.total_count(), tensor_class,
                           MemorySide::kDevice);
  }

  ParameterLayout layout_;
  ScheduleOptions options_;
  DeviceBuffer params_, grads_, adam_m_, adam_v_;
  // The sum over micro-batches, allocated on the first step that accumulates.
  DeviceBuffer accumulated_;
};

}  // namespace

std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout) {
  return make_gpu_schedule_with(std::move(backend), std::move(device), layout, {});
}

std::unique_ptr<Schedule> make_gpu_schedule_with(std::unique_ptr<ModelBackend> backend,
                                                 std::unique_ptr<Device> device,
                                                 const ParameterLayout& layout,
                                                 const ScheduleOptions& options) {
  return std::make_unique<GpuSchedule>(std::move(backend), std::move(device), layout, options);
}

}  // namespace layup
