// DeviceTier: packed device buffers for the device-updated spans, their AdamW, and ZeRO-1's
// collectives over them.
#include "schedule/device_tier.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// ZeRO-1's shards start where a span's sum-of-squares chunk does, so a rank's part of a span
// starts an 8-bit block of it and ends at one or at the span's end (check_state_part).
static_assert(kSumOfSquaresChunk % kOptimizerStateBlock == 0);

bool on_device(const ScheduleOptions& options, size_t index) {
  return index < options.update_sites.size() && options.update_sites[index] == UpdateSite::kDevice;
}

std::optional<OptimizerShards> shards_of(const ParameterLayout& layout,
                                         const ScheduleOptions& options) {
  if (options.optimizer_shards <= 1) return std::nullopt;
  return optimizer_shards(layout, options.optimizer_shards);
}

using ShardPart = OptimizerShards::Part;
ShardPart shard_part(const Span& span, const OptimizerShards& shards, int rank) {
  return shards.part(span, rank);
}

// The moments rank `rank` keeps: every device-updated span's, or its part of each (ZeRO-1).
PackedMoments rank_moments(const ParameterLayout& layout, const ScheduleOptions& options,
                           const std::optional<OptimizerShards>& shards, int rank) {
  std::vector<size_t> counts(layout.spans().size(), 0);
  for (size_t index = 0; index < counts.size(); ++index) {
    if (!on_device(options, index)) continue;
    const Span& span = layout.spans()[index];
    counts[index] = shards ? shard_part(span, *shards, rank).count : span.count;
  }
  return PackedMoments::of_counts(options.optimizer_state, std::move(counts));
}

// The bytes of this rank's moments. The shards are the same on every rank, so where the rank is
// not known yet (a plan) the largest is what the plan lists.
size_t moment_bytes(const ParameterLayout& layout, const ScheduleOptions& options) {
  const std::optional<OptimizerShards> shards = shards_of(layout, options);
  if (!shards || options.ranks != nullptr)
    return rank_moments(layout, options, shards, options.ranks ? options.ranks->rank() : 0).bytes;
  size_t largest = 0;
  for (int r = 0; r < options.optimizer_shards; ++r)
    largest = std::max(largest, rank_moments(layout, options, shards, r).bytes);
  return largest;
}

}  // namespace

DeviceTier::Buffers DeviceTier::buffers(const ParameterLayout& layout,
                                        const ScheduleOptions& options, bool whole_gradient,
                                        MemoryKind grads_kind, MemoryKind moments_kind) {
  const std::vector<Span>& all = layout.spans();
  const std::vector<UpdateSite>& sites = options.update_sites;
  LAYUP_CHECK(sites.empty() || sites.size() == all.size(), "the update sites name ", sites.size(),
              " spans, but the model has ", all.size(),
              " (the embeddings, one per block, the final norm)");
  size_t count = 0, block_floats = 0, sum_floats = 0;
  for (size_t index = 0; index < sites.size(); ++index) {
    if (!on_device(options, index)) continue;
    count += all[index].count;
    const bool own_block = all[index].kind == SpanKind::kBlock && !whole_gradient;
    (own_block ? block_floats : sum_floats) += all[index].count;
  }
  Buffers buffers;
  const size_t f = sizeof(float);
  const MemorySide side = MemorySide::kDevice;
  if (count == 0) return buffers;
  const std::string kind = name_of(options.optimizer_state);
  std::string what = count == layout.total_count()
                         ? "AdamW m and v, " + kind + " (--optimizer-state)"
                         : "AdamW m and v of the device-updated spans, " + kind;
  if (options.optimizer_shards > 1)
    what += ", this rank's shard of " + std::to_string(options.optimizer_shards) + " (ZeRO-1)";
  buffers.moments = {side, TensorClass::kOptimizerMoments, moments_kind,
                     moment_bytes(layout, options), std::move(what)};
  if (block_floats > 0)
    buffers.block_grads = {side, TensorClass::kWeightGrads, grads_kind, block_floats * f,
                           "gradients of the device-updated blocks"};
  if (sum_floats > 0)
    buffers.sums = {side, TensorClass::kWeightGrads, grads_kind, sum_floats * f,
                    whole_gradient ? "whole-model sum over micro-batches (allocated at the first "
                                     "step)"
                                   : "the device-updated head spans' gradient summed over "
                                     "micro-batches (allocated at the first step)"};
  return buffers;
}

BufferList DeviceTier::Buffers::list(bool several_micro_batches) const {
  BufferList list;
  for (const std::optional<PlannedAllocation>& buffer : {moments, block_grads})
    if (buffer) list.push_back(*buffer);
  if (sums && several_micro_batches) list.push_back(*sums);
  return list;
}

DeviceTier::DeviceTier(Device& device, const ParameterLayout& layout,
                       const ScheduleOptions& options, const MicroBatchGradients& gradients,
                       MemoryKind grads_kind, MemoryKind moments_kind)
    : device_(device),
      layout_(layout),
      gradients_(gradients),
      buffers_(buffers(layout, options, gradients.whole(), grads_kind, moments_kind)),
      ranks_(options.ranks != nullptr && options.ranks->size() > 1 ? options.ranks : nullptr),
      shards_(shards_of(layout, options)),
      moments_(rank_moments(layout, options, shards_, rank())),
      at_(layout.spans().size(), kNotHere),
      block_at_(layout.config().n_layer, kNotHere),
      sum_at_(layout.spans().size(), kNotHere) {
  const std::vector<Span>& all = layout.spans();
  size_t count = 0, block_floats = 0, sum_floats = 0;
  for (size_t index = 0; index < all.size(); ++index) {
    if (!on_device(options, index)) continue;
    spans_.push_back(index);
    at_[index] = count;
    count += all[index].count;
    if (all[index].kind == SpanKind::kBlock && !gradients.whole()) {
      block_at_[all[index].layer] = block_floats;
      block_floats += all[index].count;
    } else {
      sum_at_[index] = sum_floats;
      sum_floats += all[index].count;
    }
  }
  if (shards_) {
    LAYUP_CHECK(options.optimizer_shards == rank_count(),
                "internal error: the run was planned for ", options.optimizer_shards, " ranks but ",
                rank_count(), " run it");
    // The gradient's and the weights' collectives in device memory (MPI where that is the host's,
    // NCCL on GPUs), where the tier updates spans (offload's and some of layup's update none).
    if (!spans_.empty()) collectives_ = join_device_collectives(device, *ranks_);
  }
  if (buffers_.moments) moments_buffer_ = device.allocate(*buffers_.moments);
  if (buffers_.block_grads) block_grads_ = device.allocate(*buffers_.block_grads);
}

void DeviceTier::begin_step(size_t micro_batches) {
  summed_ = micro_batches > 1;
  if (summed_ && buffers_.sums && sums_.count() == 0) sums_ = device_.allocate(*buffers_.sums);
}

float* DeviceTier::block_gradient(int layer) const {
  if (gradients_.whole()) return gradients_.block(layer);
  LAYUP_CHECK(block_at_[layer] != kNotHere, "block ", layer, " is not updated on the device");
  return block_grads_.data() + block_at_[layer];
}

float* DeviceTier::own_gradient(size_t index) const {
  const Span& span = layout_.spans()[index];
  if (span.kind == SpanKind::kBlock && !gradients_.whole()) return block_gradient(span.layer);
  LAYUP_CHECK(sum_at_[index] != kNotHere && sums_.count() > 0, "span ", index,
              " has no sum over micro-batches on the device");
  return sums_.data() + sum_at_[index];
}

void DeviceTier::add(size_t index, const float* micro_batch, bool first) {
  float* sum = own_gradient(index);
  const size_t count = layout_.spans()[index].count;
  if (first) device_.fill_zero(sum, count);
  device_.add(sum, micro_batch, count);
}

float* DeviceTier::gradient(size_t index) const {
  const Span& span = layout_.spans()[index];
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  if (summed_ || (span.kind == SpanKind::kBlock && !gradients_.whole())) return own_gradient(index);
  // One micro-batch: where its backward left it.
  return span.kind == SpanKind::kBlock ? gradients_.block(span.layer) : gradients_.head(index);
}

template <class At, class Run>
void DeviceTier::for_each_run(At at, Run run) const {
  const std::vector<Span>& all = layout_.spans();
  for (size_t i = 0; i < spans_.size();) {
    const size_t first = spans_[i];
    size_t end = i + 1;
    while (end < spans_.size() && spans_[end] == spans_[end - 1] + 1 &&
           at(spans_[end]) == at(spans_[end - 1]) + all[spans_[end - 1]].count)
      ++end;
    const Span& last = all[spans_[end - 1]];
    run(at(first), all[first].offset, last.offset + last.count);
    i = end;
  }
}

std::vector<size_t> DeviceTier::bounds_within(size_t begin, size_t end) const {
  return shards_->bounds_within(begin, end);
}

// Span by span: each float's sum is its own, so the bits are those of one collective over a run of
// spans.
std::shared_ptr<const DeviceFence> DeviceTier::start_sum_over_ranks(size_t index,
                                                                    DeviceCollectives& collectives,
                                                                    const DeviceFence& after) {
  return collectives.start_sum_in_rank_order(device_, after, gradient(index),
                                             layout_.spans()[index].count);
}

void DeviceTier::reduce_scatter(size_t index) {
  LAYUP_CHECK(sharded(), "internal error: a reduce-scatter without optimizer shards");
  const Span& span = layout_.spans()[index];
  collectives_->reduce_scatter_in_rank_order(gradient(index),
                                             bounds_within(span.offset, span.offset + span.count));
}

void DeviceTier::sums_of_squares_of_parts(std::vector<double>& span_sum_sq, TraceRecorder* trace,
                                          int track) {
  LAYUP_CHECK(sharded(), "internal error: sums of squares of parts without optimizer shards");
  const OptimizerShards& shards = *shards_;
  TraceSpan traced(trace, track, "grad_norm");
  // Every chunk of the layout has its place; the host-updated spans' stay 0 and unread.
  std::vector<double> chunk_sums(shards.span_chunks.back(), 0.0);
  const size_t mine_begin = shards.chunk_bounds[rank()], mine_end = shards.chunk_bounds[rank() + 1];
  for (const size_t index : spans_) {
    const Span& span = layout_.spans()[index];
    const size_t first = shards.span_chunks[index], end = shards.span_chunks[index + 1];
    const size_t from = std::max(first, mine_begin), to = std::min(end, mine_end);
    if (from < to)
      device_.chunk_sums_of_squares(gradient(index), span.count, from - first, to - first,
                                    chunk_sums.data() + first);
  }
  ranks_->all_gather(chunk_sums.data(), shards.chunk_bounds);
  for (const size_t index : spans_)
    span_sum_sq[index] = add_chunk_sums(chunk_sums.data() + shards.span_chunks[index],
                                        shards.span_chunks[index + 1] - shards.span_chunks[index]);
}

bool DeviceTier::update(const AdamWStep& adamw, const std::vector<float*>& weights,
                        const std::vector<void*>& compute_copies, TraceRecorder* trace, int track) {
  bool copies_written = !spans_.empty();
  for (const size_t index : spans_) {
    const Span& span = layout_.spans()[index];
    const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
    if (shards_) {
      const ShardPart part = shard_part(span, *shards_, rank());
      if (part.count == 0) continue;
      TraceSpan traced(trace, track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
      device_.adamw_update_span_part_state(layout_, span, part.first, part.count,
                                           weights[index] + part.first,
                                           gradient(index) + part.first, moments, adamw,
                                           /*bf16_weights=*/nullptr);
      continue;
    }
    TraceSpan traced(trace, track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
    void* compute_copy = compute_copies.empty() ? nullptr : compute_copies[index];
    copies_written = copies_written && compute_copy != nullptr;
    device_.adamw_update_span_state(layout_, span, weights[index], gradient(index), moments, adamw,
                                    compute_copy);
  }
  if (!shards_) return copies_written;
  {
    TraceSpan traced(trace, track, "all_gather_weights");
    for_each_run([&weights](size_t index) { return weights[index]; },
                 [&](float* data, size_t begin, size_t end) {
                   collectives_->all_gather(data, bounds_within(begin, end));
                 });
  }
  // The gathered weights into the compute copies, where the backend keeps them: with weights
  // landing in the compute copy no forward casts them again.
  if (compute_copies.empty()) return false;
  for (const size_t index : spans_) {
    if (compute_copies[index] == nullptr) return false;
    device_.cast_to_compute_copy(compute_copies[index], weights[index],
                                 layout_.spans()[index].count);
  }
  return copies_written;
}

void DeviceTier::read_span(size_t index, const SpanState& out, const float* weights) const {
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  const Span& span = layout_.spans()[index];
  const size_t count = span.count;
  if (out.params) device_.copy_to_host(out.params, weights, count);
  if (out.m == nullptr && out.v == nullptr && out.coded == nullptr) return;
  LAYUP_CHECK(!shards_ || rank() == 0,
              "internal error: only rank 0 exports the optimizer state of a sharded run");
  const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
  if (!shards_ && out.coded != nullptr) {  // the buffer's layout of the span is the coded one
    device_.copy_to_host(static_cast<float*>(out.coded),
                         moments_.base(moments_buffer_.data(), index), moments_.floats(index));
    return;
  }
  if (!shards_ && moments.kind == OptimizerStateKind::kFp32) {  // straight into `out`
    if (out.m) device_.copy_to_host(out.m, moments.m_fp32(), count);
    if (out.v) device_.copy_to_host(out.v, moments.v_fp32(), count);
    return;
  }
  // Each part (the whole span, or with ZeRO-1 every rank's part) decoded from its first element:
  // this rank's from its buffer, the others' asked of their owners.
  std::vector<float> packed;
  for (int r = 0; r < (shards_ ? rank_count() : 1); ++r) {
    const ShardPart part = shards_ ? shard_part(span, *shards_, r) : ShardPart{0, count};
    if (part.count == 0) continue;
    packed.resize(PackedMoments::padded_bytes(moments_.kind, part.count) / sizeof(float));
    if (!shards_ || r == rank()) {
      device_.copy_to_host(packed.data(), moments_.base(moments_buffer_.data(), index),
                           packed.size());
    } else {
      const uint64_t request[4] = {kSendMoments, index, 0, 0};
      ranks_->send(request, 4, r);
      ranks_->receive(packed.data(), packed.size(), r);
    }
    const AdamWMoments in_part = AdamWMoments::in_buffer(moments_.kind, packed.data(), part.count);
    if (out.coded != nullptr)
      copy_moments(in_part, AdamWMoments::in_buffer(moments_.kind, out.coded, count).at(part.first),
                   part.count);
    else
      decode_moments(in_part, part.count, out.m ? out.m + part.first : nullptr,
                     out.v ? out.v + part.first : nullptr);
  }
}

void DeviceTier::write_span(size_t index, const ConstSpanState& in) {
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  const Span& span = layout_.spans()[index];
  // Every rank writes every span, and keeps its own part of the moments (ZeRO-1).
  const size_t first = shards_ ? shard_part(span, *shards_, rank()).first : 0;
  const size_t count = moments_.counts[index];
  if (count == 0) return;
  const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
  float* base = moments_.base(moments_buffer_.data(), index);
  if (in.coded != nullptr && !shards_) {
    device_.copy_to_device(base, static_cast<const float*>(in.coded), moments_.floats(index));
    return;
  }
  if (in.coded == nullptr && moments.kind == OptimizerStateKind::kFp32) {
    device_.copy_to_device(moments.m_fp32(), in.m + first, count);
    device_.copy_to_device(moments.v_fp32(), in.v + first, count);
    return;
  }
  // Coded from the span's (or the part's) first element, as its updates code it.
  std::vector<float> packed(moments_.floats(index));
  const AdamWMoments staged = AdamWMoments::in_buffer(moments.kind, packed.data(), count);
  if (in.coded != nullptr)
    copy_moments(
        AdamWMoments::in_buffer(moments.kind, const_cast<void*>(in.coded), span.count).at(first),
        staged, count);
  else
    encode_moments(in.m + first, in.v + first, count, staged);
  device_.copy_to_device(base, packed.data(), packed.size());
}

void DeviceTier::send_moments(size_t index) const {
  LAYUP_CHECK(shards_ && index < layout_.spans().size() && moments_.holds(index),
              "internal error: rank 0 asked for moments this rank does not own");
  // Through host memory: MPI reads the host's, and on a GPU the part is in the device's.
  std::vector<float> packed(moments_.floats(index));
  device_.copy_to_host(packed.data(), moments_.base(moments_buffer_.data(), index), packed.size());
  ranks_->send(packed.data(), packed.size(), 0);
}

}  // namespace layup
