// The `gpu` mode: the whole training step on one device, the baseline every mode is measured
// against. On the CPU backend "the device" is the host; the step is the same. Its sums follow the
// order every mode uses (docs/schedules.md, "Why the three modes train alike"): per-span sums of
// squares added in layout order, micro-batches added one float add per element, in order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/mode_schedules.h"
#include "schedule/optimizer_shards.h"
#include "schedule/schedule.h"
#include "schedule/span_square_sums.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// The moments this rank keeps: all of them, or its shard (ZeRO-1) where several share them. The
// shards are the same on every rank, so the largest is what the plan lists.
size_t moment_count(const ParameterLayout& layout, const ScheduleOptions& options) {
  if (options.optimizer_shards <= 1) return layout.total_count();
  const OptimizerShards shards = optimizer_shards(layout, options.optimizer_shards);
  const int rank = options.ranks != nullptr ? options.ranks->rank() : -1;
  if (rank >= 0) return shards.count(rank);
  size_t largest = 0;
  for (int r = 0; r < options.optimizer_shards; ++r) largest = std::max(largest, shards.count(r));
  return largest;
}

// What gpu mode allocates: every class whole, on the device side; the moments split across the
// ranks where several train.
struct GpuBuffers {
  PlannedAllocation params, grads, m, v, accumulated, span_sums;

  GpuBuffers(const ParameterLayout& layout, const ScheduleOptions& options, DeviceKinds kinds)
      : params(whole(layout, options, kinds, TensorClass::kMasterWeights,
                     "fp32 weights: read by forward, updated by AdamW")),
        grads(whole(layout, options, kinds, TensorClass::kWeightGrads, "whole-model gradient")),
        m(placed_buffer(options, kinds, moment_count(layout, options),
                        TensorClass::kOptimizerMoments, MemorySide::kDevice,
                        moments_what("AdamW m", options))),
        v(placed_buffer(options, kinds, moment_count(layout, options),
                        TensorClass::kOptimizerMoments, MemorySide::kDevice,
                        moments_what("AdamW v", options))),
        accumulated(whole(layout, options, kinds, TensorClass::kWeightGrads,
                          "whole-model sum over micro-batches (allocated at the first step)")),
        span_sums(SpanSquareSums::buffer(layout.spans().size(), kinds)) {}

  static PlannedAllocation whole(const ParameterLayout& layout, const ScheduleOptions& options,
                                 DeviceKinds kinds, TensorClass tensor_class, std::string what) {
    return placed_buffer(options, kinds, layout.total_count(), tensor_class, MemorySide::kDevice,
                         std::move(what));
  }
  static std::string moments_what(const std::string& what, const ScheduleOptions& options) {
    return options.optimizer_shards > 1 ? what + ", this rank's shard of " +
                                              std::to_string(options.optimizer_shards) + " (ZeRO-1)"
                                        : what;
  }
};

class GpuSchedule final : public Schedule {
 public:
  GpuSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
              const ParameterLayout& layout, const ScheduleOptions& options)
      : layout_(layout),
        backend_(std::move(backend)),
        device_(std::move(device)),
        buffers_(layout, options, device_->kinds()),
        params_(device_->allocate(buffers_.params)),
        grads_(device_->allocate(buffers_.grads)),
        adam_m_(device_->allocate(buffers_.m)),
        adam_v_(device_->allocate(buffers_.v)),
        span_sums_(*device_, layout.spans().size()),
        ranks_(options.ranks) {
    // The gradients stay in device memory: summed there.
    if (rank_count() > 1) collectives_ = join_device_collectives(*device_, *ranks_);
    LAYUP_CHECK(options.optimizer_shards == 1 || options.optimizer_shards == rank_count(),
                "internal error: the run was planned for ", options.optimizer_shards, " ranks but ",
                rank_count(), " run it");
    if (options.optimizer_shards > 1) shards_ = optimizer_shards(layout, rank_count());
  }

  std::string name() const override { return "gpu"; }
  const ParameterLayout& layout() const override { return layout_; }
  void set_trace(TraceRecorder* recorder) override {
    trace_ = recorder;
    device_track_ = device_track(recorder);
  }

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
    if (shards_) return sharded_update(loss_sum, global_micro_batches, settings);
    if (rank_count() > 1) {
      // Every rank's gradient summed in rank order, as one process accumulating the ranks'
      // micro-batches in that order would (bitwise where each rank has one); the losses alike.
      TraceSpan traced(trace_, device_track_, "sum_over_ranks");
      collectives_->sum_in_rank_order(grads_.data(), grads_.count());
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
      TraceSpan traced(trace_, device_track_, trace_name(TaskKind::kAdamW, span.kind), span.layer);
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
    if (shards_) {
      export_sharded_moments(span, out);
      return;
    }
    if (out.m) device_->copy_to_host(out.m, adam_m_.data() + span.offset, span.count);
    if (out.v) device_->copy_to_host(out.v, adam_v_.data() + span.offset, span.count);
  }

  void import_span(size_t index, const ConstSpanState& in) override {
    const Span& span = layout_.spans()[index];
    backend_->set_compute_copies_current(false);  // the forward casts the new weights
    device_->copy_to_device(params_.data() + span.offset, in.params, span.count);
    if (shards_) {  // every rank imports every span, and keeps its own part of the moments
      const Part part = own_part(span);
      device_->copy_to_device(adam_m_.data() + part.at, in.m + part.first, part.count);
      device_->copy_to_device(adam_v_.data() + part.at, in.v + part.first, part.count);
      return;
    }
    device_->copy_to_device(adam_m_.data() + span.offset, in.m, span.count);
    device_->copy_to_device(adam_v_.data() + span.offset, in.v, span.count);
  }

  void serve_exports() override {
    if (!shards_ || ranks_->rank() == 0) return;
    for (;;) {
      uint64_t request[4];  // moment (0: none, the end; 1: m; 2: v), first element, count
      ranks_->receive(request, 4, 0);
      if (request[0] == 0) return;
      const float* moment = request[0] == 1 ? adam_m_.data() : adam_v_.data();
      const size_t at = request[1] - shards_->begin(ranks_->rank());
      LAYUP_CHECK(request[1] >= shards_->begin(ranks_->rank()) &&
                      at + request[2] <= shards_->count(ranks_->rank()),
                  "internal error: rank 0 asked for moments this rank does not own");
      ranks_->send(moment + at, request[2], 0);
    }
  }

  void end_exports() override {
    if (!shards_) return;
    const uint64_t end[4] = {0, 0, 0, 0};
    for (int r = 1; r < rank_count(); ++r) ranks_->send(end, 4, r);
  }

 private:
  // A span's part in this rank's shard: `count` elements from element `first` of the span, at
  // `at` in the shard's moments.
  struct Part {
    size_t first = 0, count = 0, at = 0;
  };
  Part own_part(const Span& span) const {
    const size_t begin = std::max(span.offset, shards_->begin(ranks_->rank()));
    const size_t end = std::min(span.offset + span.count, shards_->end(ranks_->rank()));
    if (begin >= end) return {};
    return {begin - span.offset, end - begin, begin - shards_->begin(ranks_->rank())};
  }

  // ZeRO-1 (docs/parallel.md): each rank gets the rank-order sum of its shard of the gradient,
  // takes its whole chunks' sums of squares, which every rank then adds in the order every mode
  // adds them; updates its shard; and the shards' new weights go to every rank.
  StepStats sharded_update(double loss_sum, size_t global_micro_batches,
                           const UpdateSettings& settings) {
    const OptimizerShards& shards = *shards_;
    const int rank = ranks_->rank();
    StepStats stats;
    {
      TraceSpan traced(trace_, device_track_, "reduce_scatter");
      ranks_->reduce_scatter_in_rank_order(grads_.data(), shards.bounds);
      stats.loss = static_cast<float>(ranks_->sum_in_rank_order(loss_sum) / global_micro_batches);
    }
    double sum_sq = 0.0;
    {
      TraceSpan traced(trace_, device_track_, "grad_norm");
      std::vector<double> chunk_sums(shards.span_chunks.back(), 0.0);
      const size_t mine_begin = shards.chunk_bounds[rank], mine_end = shards.chunk_bounds[rank + 1];
      for (size_t i = 0; i < layout_.spans().size(); ++i) {
        const Span& span = layout_.spans()[i];
        const size_t first = shards.span_chunks[i], end = shards.span_chunks[i + 1];
        const size_t from = std::max(first, mine_begin), to = std::min(end, mine_end);
        if (from < to)
          chunk_sums_of_squares(grads_.data() + span.offset, span.count, from - first, to - first,
                                chunk_sums.data() + first);
      }
      ranks_->all_gather(chunk_sums.data(), shards.chunk_bounds);
      for (size_t i = 0; i < layout_.spans().size(); ++i)
        sum_sq += add_chunk_sums(chunk_sums.data() + shards.span_chunks[i],
                                 shards.span_chunks[i + 1] - shards.span_chunks[i]);
    }
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    for (const Span& span : layout_.spans()) {
      const Part part = own_part(span);
      if (part.count == 0) continue;
      TraceSpan traced(trace_, device_track_, trace_name(TaskKind::kAdamW, span.kind), span.layer);
      const size_t at = span.offset + part.first;
      device_->adamw_update_span_part(layout_, span, part.first, part.count, params_.data() + at,
                                      grads_.data() + at, adam_m_.data() + part.at,
                                      adam_v_.data() + part.at, adamw);
    }
    {
      TraceSpan traced(trace_, device_track_, "all_gather_weights");
      ranks_->all_gather(params_.data(), shards.bounds);
    }
    backend_->set_compute_copies_current(false);
    stats.applied = true;
    return stats;
  }

  // Rank 0's export of a span's moments: its own part from its shard, the others' asked of their
  // owners, who answer in serve_exports.
  void export_sharded_moments(const Span& span, const SpanState& out) const {
    if (out.m == nullptr && out.v == nullptr) return;  // the weights alone: every rank has them
    LAYUP_CHECK(ranks_->rank() == 0,
                "internal error: only rank 0 exports the optimizer state of a sharded run");
    for (int r = 0; r < rank_count(); ++r) {
      const size_t begin = std::max(span.offset, shards_->begin(r));
      const size_t end = std::min(span.offset + span.count, shards_->end(r));
      if (begin >= end) continue;
      for (const auto& [moment, which, code] :
           {std::tuple{out.m, &adam_m_, uint64_t{1}}, std::tuple{out.v, &adam_v_, uint64_t{2}}}) {
        if (moment == nullptr) continue;
        float* into = moment + (begin - span.offset);
        if (r == 0) {
          device_->copy_to_host(into, which->data() + (begin - shards_->begin(0)), end - begin);
        } else {
          const uint64_t request[4] = {code, begin, end - begin, 0};
          ranks_->send(request, 4, r);
          ranks_->receive(into, end - begin, r);
        }
      }
    }
  }

  const ParameterLayout layout_;
  TraceRecorder* trace_ = nullptr;
  int device_track_ = 0;  // "GPU" in trace_
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const GpuBuffers buffers_;
  DeviceBuffer params_, grads_, adam_m_, adam_v_;
  SpanSquareSums span_sums_;  // each span's gradient sum of squares
  // The sum over micro-batches, allocated on the first step that accumulates.
  DeviceBuffer accumulated_;
  Communicator* ranks_;                    // data parallel; null: this process alone
  std::optional<OptimizerShards> shards_;  // ZeRO-1: the moments split across the ranks
  // Where several ranks train: their sums in device memory.
  std::unique_ptr<DeviceCollectives> collectives_;

  int rank_count() const { return ranks_ ? ranks_->size() : 1; }
};

}  // namespace

BufferList gpu_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                DeviceKinds kinds, int micro_batches) {
  const GpuBuffers buffers(layout, options, kinds);
  BufferList list = {buffers.params, buffers.grads, buffers.m, buffers.v, buffers.span_sums};
  if (micro_batches > 1) list.push_back(buffers.accumulated);
  return list;
}

std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout,
                                            const ScheduleOptions& options) {
  return std::make_unique<GpuSchedule>(std::move(backend), std::move(device), layout, options);
}

}  // namespace layup
