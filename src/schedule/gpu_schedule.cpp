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
#include "schedule/packed_moments.h"
#include "schedule/schedule.h"
#include "schedule/span_square_sums.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// ZeRO-1's shards start where a span's sum-of-squares chunk does, so a rank's part of a span
// starts an 8-bit block of it and ends at one or at the span's end (check_state_part).
static_assert(kSumOfSquaresChunk % kOptimizerStateBlock == 0);

// A span's part in a shard: `count` elements from element `first` of the span.
struct ShardPart {
  size_t first = 0, count = 0;
};
ShardPart shard_part(const Span& span, const OptimizerShards& shards, int rank) {
  const size_t begin = std::max(span.offset, shards.begin(rank));
  const size_t end = std::min(span.offset + span.count, shards.end(rank));
  if (begin >= end) return {};
  return {begin - span.offset, end - begin};
}

// The moments rank `rank` keeps in the run's kind: every span's, or its part of each (ZeRO-1).
PackedMoments rank_moments(const ParameterLayout& layout, OptimizerStateKind kind,
                           const std::optional<OptimizerShards>& shards, int rank) {
  if (!shards) return PackedMoments::all(kind, layout);
  std::vector<size_t> counts;
  for (const Span& span : layout.spans()) counts.push_back(shard_part(span, *shards, rank).count);
  return PackedMoments::of_counts(kind, std::move(counts));
}

std::optional<OptimizerShards> shards_of(const ParameterLayout& layout,
                                         const ScheduleOptions& options) {
  if (options.optimizer_shards <= 1) return std::nullopt;
  return optimizer_shards(layout, options.optimizer_shards);
}

// The floats of this rank's moments buffer. The shards are the same on every rank, so where the
// rank is not known yet (a plan) the largest is what the plan lists.
size_t moment_floats(const ParameterLayout& layout, const ScheduleOptions& options) {
  const std::optional<OptimizerShards> shards = shards_of(layout, options);
  const int rank = options.ranks != nullptr ? options.ranks->rank() : -1;
  if (!shards || rank >= 0)
    return rank_moments(layout, options.optimizer_state, shards, std::max(rank, 0)).floats();
  size_t largest = 0;
  for (int r = 0; r < options.optimizer_shards; ++r)
    largest = std::max(largest, rank_moments(layout, options.optimizer_state, shards, r).floats());
  return largest;
}

// What gpu mode allocates: every class whole, on the device side; the moments split across the
// ranks where several train.
struct GpuBuffers {
  PlannedAllocation params, grads, moments, accumulated, span_sums;

  GpuBuffers(const ParameterLayout& layout, const ScheduleOptions& options, DeviceKinds kinds)
      : params(whole(layout, options, kinds, TensorClass::kMasterWeights,
                     "fp32 weights: read by forward, updated by AdamW")),
        grads(whole(layout, options, kinds, TensorClass::kWeightGrads, "whole-model gradient")),
        moments(placed_buffer(options, kinds, moment_floats(layout, options),
                              TensorClass::kOptimizerMoments, MemorySide::kDevice,
                              moments_what("AdamW m and v, " + name_of(options.optimizer_state) +
                                               " (--optimizer-state)",
                                           options))),
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
        moments_buffer_(device_->allocate(buffers_.moments)),
        span_sums_(*device_, layout.spans().size()),
        ranks_(options.ranks) {
    // The gradients stay in device memory: summed there.
    if (rank_count() > 1) collectives_ = join_device_collectives(*device_, *ranks_);
    LAYUP_CHECK(options.optimizer_shards == 1 || options.optimizer_shards == rank_count(),
                "internal error: the run was planned for ", options.optimizer_shards, " ranks but ",
                rank_count(), " run it");
    shards_ = shards_of(layout, options);
    moments_ = rank_moments(layout, options.optimizer_state, shards_, rank());
  }

  std::string name() const override { return "gpu"; }
  OptimizerStateKind optimizer_state() const override { return moments_.kind; }
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
    // Where the backend computes with a bf16 copy of the weights, the update writes it too (in
    // every optimizer state kind), and the next forward skips its cast pass (6 bytes a parameter
    // less to move each step).
    bool copies_written = true;
    for (size_t i = 0; i < layout_.spans().size(); ++i) {
      const Span& span = layout_.spans()[i];
      TraceSpan traced(trace_, device_track_, trace_name(TaskKind::kAdamW, span.kind), span.layer);
      void* compute_copy = backend_->compute_copy(i);
      copies_written = copies_written && compute_copy != nullptr;
      device_->adamw_update_span_state(layout_, span, params_.data() + span.offset,
                                       grads_.data() + span.offset,
                                       moments_.in(moments_buffer_.data(), i), adamw, compute_copy);
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
    // The weights alone: every rank has them.
    if (out.m == nullptr && out.v == nullptr && out.coded == nullptr) return;
    if (shards_) {
      export_sharded_moments(index, out);
      return;
    }
    if (out.coded != nullptr) {  // the buffer's layout of the span is the coded one
      device_->copy_to_host(static_cast<float*>(out.coded),
                            moments_.base(moments_buffer_.data(), index), moments_.floats(index));
      return;
    }
    if (moments_.kind == OptimizerStateKind::kFp32) {  // straight into `out`
      const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
      if (out.m) device_->copy_to_host(out.m, moments.m_fp32(), span.count);
      if (out.v) device_->copy_to_host(out.v, moments.v_fp32(), span.count);
      return;
    }
    std::vector<float> packed(moments_.floats(index));
    device_->copy_to_host(packed.data(), moments_.base(moments_buffer_.data(), index),
                          packed.size());
    decode_moments(AdamWMoments::in_buffer(moments_.kind, packed.data(), span.count), span.count,
                   out.m, out.v);
  }

  void import_span(size_t index, const ConstSpanState& in) override {
    const Span& span = layout_.spans()[index];
    backend_->set_compute_copies_current(false);  // the forward casts the new weights
    device_->copy_to_device(params_.data() + span.offset, in.params, span.count);
    // Every rank imports every span, and keeps its own part of the moments (ZeRO-1).
    const size_t first = shards_ ? shard_part(span, *shards_, rank()).first : 0;
    const size_t count = moments_.counts[index];
    if (count == 0) return;
    if (in.coded != nullptr) {
      std::vector<float> packed(moments_.floats(index));
      const AdamWMoments all = coded_moments(in.coded, span.count);
      copy_moments(all.at(first), AdamWMoments::in_buffer(moments_.kind, packed.data(), count),
                   count);
      device_->copy_to_device(moments_.base(moments_buffer_.data(), index), packed.data(),
                              packed.size());
      return;
    }
    if (moments_.kind == OptimizerStateKind::kFp32) {
      const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
      device_->copy_to_device(moments.m_fp32(), in.m + first, count);
      device_->copy_to_device(moments.v_fp32(), in.v + first, count);
      return;
    }
    // Coded from the span's (or the part's) first element, as the updates code it.
    std::vector<float> packed(moments_.floats(index));
    encode_moments(in.m + first, in.v + first, count,
                   AdamWMoments::in_buffer(moments_.kind, packed.data(), count));
    device_->copy_to_device(moments_.base(moments_buffer_.data(), index), packed.data(),
                            packed.size());
  }

  void serve_exports() override {
    if (!shards_ || ranks_->rank() == 0) return;
    for (;;) {
      uint64_t request[4];  // 0: the end; 1: this rank's moments of span request[1]
      ranks_->receive(request, 4, 0);
      if (request[0] == 0) return;
      const size_t index = request[1];
      LAYUP_CHECK(index < layout_.spans().size() && moments_.holds(index),
                  "internal error: rank 0 asked for moments this rank does not own");
      ranks_->send(moments_.base(moments_buffer_.data(), index), moments_.floats(index), 0);
    }
  }

  void end_exports() override {
    if (!shards_) return;
    const uint64_t end[4] = {0, 0, 0, 0};
    for (int r = 1; r < rank_count(); ++r) ranks_->send(end, 4, r);
  }

 private:
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
    for (size_t i = 0; i < layout_.spans().size(); ++i) {
      const Span& span = layout_.spans()[i];
      const ShardPart part = shard_part(span, shards, rank);
      if (part.count == 0) continue;
      TraceSpan traced(trace_, device_track_, trace_name(TaskKind::kAdamW, span.kind), span.layer);
      const size_t at = span.offset + part.first;
      device_->adamw_update_span_part_state(layout_, span, part.first, part.count,
                                            params_.data() + at, grads_.data() + at,
                                            moments_.in(moments_buffer_.data(), i), adamw);
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
  // owners, who answer in serve_exports; each part decoded from its first element.
  void export_sharded_moments(size_t index, const SpanState& out) const {
    LAYUP_CHECK(ranks_->rank() == 0,
                "internal error: only rank 0 exports the optimizer state of a sharded run");
    const Span& span = layout_.spans()[index];
    std::vector<float> packed;
    for (int r = 0; r < rank_count(); ++r) {
      const ShardPart part = shard_part(span, *shards_, r);
      if (part.count == 0) continue;
      packed.resize(PackedMoments::padded_bytes(moments_.kind, part.count) / sizeof(float));
      if (r == 0) {
        device_->copy_to_host(packed.data(), moments_.base(moments_buffer_.data(), index),
                              packed.size());
      } else {
        const uint64_t request[4] = {1, index, 0, 0};
        ranks_->send(request, 4, r);
        ranks_->receive(packed.data(), packed.size(), r);
      }
      const AdamWMoments got = AdamWMoments::in_buffer(moments_.kind, packed.data(), part.count);
      if (out.coded != nullptr)
        copy_moments(got, coded_moments(out.coded, span.count).at(part.first), part.count);
      else
        decode_moments(got, part.count, out.m ? out.m + part.first : nullptr,
                       out.v ? out.v + part.first : nullptr);
    }
  }

  const ParameterLayout layout_;
  TraceRecorder* trace_ = nullptr;
  int device_track_ = 0;  // "GPU" in trace_
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  const GpuBuffers buffers_;
  DeviceBuffer params_, grads_;
  DeviceBuffer moments_buffer_;  // this rank's moments in the run's kind, laid out by moments_
  PackedMoments moments_;
  SpanSquareSums span_sums_;  // each span's gradient sum of squares
  // The sum over micro-batches, allocated on the first step that accumulates.
  DeviceBuffer accumulated_;
  Communicator* ranks_;                    // data parallel; null: this process alone
  std::optional<OptimizerShards> shards_;  // ZeRO-1: the moments split across the ranks
  // Where several ranks train: their sums in device memory.
  std::unique_ptr<DeviceCollectives> collectives_;

  int rank_count() const { return ranks_ ? ranks_->size() : 1; }
  // A span's coded moments (SpanState::coded), read or written through AdamWMoments.
  AdamWMoments coded_moments(const void* coded, size_t count) const {
    return AdamWMoments::in_buffer(moments_.kind, const_cast<void*>(coded), count);
  }
  int rank() const { return ranks_ ? ranks_->rank() : 0; }
};

}  // namespace

BufferList gpu_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                DeviceKinds kinds, int micro_batches) {
  const GpuBuffers buffers(layout, options, kinds);
  BufferList list = {buffers.params, buffers.grads, buffers.moments, buffers.span_sums};
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
