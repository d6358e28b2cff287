// The `gpu` mode: the whole training step on one device, the baseline every mode is measured
// against. On the CPU backend "the device" is the host; the step is the same. Its sums follow the
// order every mode uses (docs/schedules.md, "Why the three modes train alike"): per-span sums of
// squares added in layout order, micro-batches added one float add per element, in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/schedule.h"
#include "schedule/span_square_sums.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// What gpu mode allocates: every class whole, on the device side.
struct GpuBuffers {
  PlannedAllocation params, grads, m, v, accumulated, span_sums;

  GpuBuffers(const ParameterLayout& layout, const ScheduleOptions& options, DeviceKinds kinds)
      : params(whole(layout, options, kinds, TensorClass::kMasterWeights,
                     "fp32 weights: read by forward, updated by AdamW")),
        grads(whole(layout, options, kinds, TensorClass::kWeightGrads, "whole-model gradient")),
        m(whole(layout, options, kinds, TensorClass::kOptimizerMoments, "AdamW m")),
        v(whole(layout, options, kinds, TensorClass::kOptimizerMoments, "AdamW v")),
        accumulated(whole(layout, options, kinds, TensorClass::kWeightGrads,
                          "whole-model sum over micro-batches (allocated at the first step)")),
        span_sums(SpanSquareSums::buffer(layout.spans().size(), kinds)) {}

  static PlannedAllocation whole(const ParameterLayout& layout, const ScheduleOptions& options,
                                 DeviceKinds kinds, TensorClass tensor_class, std::string what) {
    return placed_buffer(options, kinds, layout.total_count(), tensor_class, MemorySide::kDevice,
                         std::move(what));
  }
};

class GpuSchedule final : public Schedule {
 public:
  GpuSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
              const ParameterLayout& layout, const ScheduleOptions& options)
      : Schedule(layout),
        backend_(std::move(backend)),
        device_(std::move(device)),
        buffers_(layout, options, device_->kinds()),
        params_(device_->allocate(buffers_.params)),
        grads_(device_->allocate(buffers_.grads)),
        adam_m_(device_->allocate(buffers_.m)),
        adam_v_(device_->allocate(buffers_.v)),
        span_sums_(*device_, layout.spans().size()),
        ranks_(options.ranks) {
    LAYUP_CHECK(rank_count() == 1 || device_->kinds().own == MemoryKind::kHost,
                "several ranks (mpirun) train on the CPU backend only for now: the gradients are "
                "summed over MPI in host memory (NCCL for GPUs is to come); use --device cpu or "
                "one rank");
  }

  std::string name() const override { return "gpu"; }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    const ParameterPointers params = layout_.pointers<const float>(params_.data());
    const GradientPointers grads = layout_.pointers(grads_.data());
    const bool accumulate = micro_batches.size() > 1;
    if (accumulate) {
      if (accumulated_.count() == 0) accumulated_ = device_->allocate(buffers_.accumulated);
      device_->fill_zero(accumulated_.data(), accumulated_.count());
    }

    // The global batch is every rank's micro-batches: each one's share of the mean loss.
    const size_t global_micro_batches = micro_batches.size() * rank_count();
    const float loss_scale = 1.0f / static_cast<float>(global_micro_batches);
    double loss_sum = 0.0;
    for (const TokenBatch& batch : micro_batches) {
      // The backward overwrites grads_ (ModelBackend): no zeroing.
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
    if (rank_count() > 1) {
      // Every rank's gradient summed in rank order, as one process accumulating the ranks'
      // micro-batches in that order would (bitwise where each rank has one); the losses alike.
      TraceSpan traced(trace_, device_track_, "sum_over_ranks");
      ranks_->sum_in_rank_order(grads_.data(), grads_.count());
      loss_sum = ranks_->sum_in_rank_order(loss_sum);
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / global_micro_batches);
    // Per-span sums added in layout order: the fixed order every mode uses. All spans' sums are
    // started, then read after one wait: reading each at once would leave the GPU idle while the
    // host reads it and launches the next (50 times a step at gpt2-xl).
    double sum_sq = 0.0;
    {
      TraceSpan traced(trace_, device_track_, "grad_norm");
      for (size_t i = 0; i < layout_.spans().size(); ++i) {
        const Span& span = layout_.spans()[i];
        span_sums_.start(i, grads_.data() + span.offset, span.count);
      }
      device_->wait_for(*device_->fence());
      for (size_t i = 0; i < layout_.spans().size(); ++i) sum_sq += span_sums_.take(i);
    }
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    // Where the backend computes with a bf16 copy of the weights, the update writes it too, and
    // the next forward skips its cast pass (6 bytes a parameter less to move each step).
    bool copies_written = true;
    for (size_t i = 0; i < layout_.spans().size(); ++i) {
      const Span& span = layout_.spans()[i];
      TraceSpan traced(trace_, device_track_, adamw_trace_name(span.kind), span.layer);
      void* compute_copy = backend_->compute_copy(i);
      copies_written = copies_written && compute_copy != nullptr;
      device_->adamw_update_span(layout_, span, params_.data() + span.offset,
                                 grads_.data() + span.offset, adam_m_.data() + span.offset,
                                 adam_v_.data() + span.offset, adamw, compute_copy);
    }
    if (copies_written) backend_->set_compute_copies_current(true);
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

  void export_span(size_t index, const SpanState& out) const override {
    const Span& span = layout_.spans()[index];
    if (out.params) device_->copy_to_host(out.params, params_.data() + span.offset, span.count);
    if (out.m) device_->copy_to_host(out.m, adam_m_.data() + span.offset, span.count);
    if (out.v) device_->copy_to_host(out.v, adam_v_.data() + span.offset, span.count);
  }

  void import_span(size_t index, const ConstSpanState& in) override {
    const Span& span = layout_.spans()[index];
    backend_->set_compute_copies_current(false);  // the forward casts the new weights
    device_->copy_to_device(params_.data() + span.offset, in.params, span.count);
    device_->copy_to_device(adam_m_.data() + span.offset, in.m, span.count);
    device_->copy_to_device(adam_v_.data() + span.offset, in.v, span.count);
  }

 private:
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const GpuBuffers buffers_;
  DeviceBuffer params_, grads_, adam_m_, adam_v_;
  SpanSquareSums span_sums_;  // each span's gradient sum of squares
  // The sum over micro-batches, allocated on the first step that accumulates.
  DeviceBuffer accumulated_;
  Communicator* ranks_;  // data parallel; null: this process alone

  int rank_count() const { return ranks_ ? ranks_->size() : 1; }
};

}  // namespace

std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout) {
  return make_gpu_schedule_with(std::move(backend), std::move(device), layout, {});
}

BufferList gpu_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                DeviceKinds kinds, int micro_batches) {
  const GpuBuffers buffers(layout, options, kinds);
  BufferList list = {buffers.params, buffers.grads, buffers.m, buffers.v, buffers.span_sums};
  if (micro_batches > 1) list.push_back(buffers.accumulated);
  return list;
}

std::unique_ptr<Schedule> make_gpu_schedule_with(std::unique_ptr<ModelBackend> backend,
                                                 std::unique_ptr<Device> device,
                                                 const ParameterLayout& layout,
                                                 const ScheduleOptions& options) {
  return std::make_unique<GpuSchedule>(std::move(backend), std::move(device), layout, options);
}

}  // namespace layup
