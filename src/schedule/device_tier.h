// DeviceTier: the spans a plan updates on the device (ScheduleOptions::update_sites; gpu mode:
// every span): their AdamW moments in device memory, their gradient kept there until the step's
// norm is known (summed there over micro-batches), and their update by the device's AdamW in the
// device copy of the weights, in the device's order before the next forward. See docs/schedules.md.
//
// Memory: the moments of every device-updated span packed into one buffer in the run's optimizer
// state kind, in layout order (PackedMoments); with ZeRO-1 (ScheduleOptions::optimizer_shards > 1)
// only this rank's part of each span (optimizer_shards.h). Where the backward writes a micro-batch
// (MicroBatchGradients): with slots (layup), a device-updated block's gradient has a place of its
// own in one packed buffer (in the weight gradients' kind, as the slots), which one micro-batch's
// backward writes and several sum into; the head spans' sum over several micro-batches lies in a
// packed buffer allocated at the first step that has several. With the whole-model gradient (gpu),
// one micro-batch's gradient is read where the backward left it, and the sums of several lie in one
// packed buffer of every device-updated span, allocated at the first step that has several.
//
// Threads: the device thread issues all of its device work; step() calls begin_step before the
// device thread starts and the state copies between steps. With several ranks its collectives run
// on one thread at a time (the consumer during the step, span by span as each span's gradient is
// final, while the device computes the spans below; the device thread for the update).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "schedule/micro_batch_gradients.h"
#include "schedule/optimizer_shards.h"
#include "schedule/packed_moments.h"
#include "schedule/schedule.h"

namespace layup {

class TraceRecorder;

class DeviceTier {
 public:
  // Of `options`: update_sites (one per span, or empty: no span on the device), optimizer_state,
  // optimizer_shards and ranks. `gradients` is where the backward writes one micro-batch. `device`
  // and `gradients` must outlive this. Its gradient buffers take memory of `grads_kind`, the
  // moments of `moments_kind`.
  DeviceTier(Device& device, const ParameterLayout& layout, const ScheduleOptions& options,
             const MicroBatchGradients& gradients, MemoryKind grads_kind, MemoryKind moments_kind);

  // What it allocates with `options` (none where no span is on the device): the packed moments and
  // block gradients at construction, the sums over micro-batches at the first step of several.
  // `whole_gradient`: the backward writes the whole-model gradient (MicroBatchGradients::whole).
  struct Buffers {
    std::optional<PlannedAllocation> moments, block_grads, sums;
    // With sums when a step has several micro-batches.
    BufferList list(bool several_micro_batches) const;
  };
  static Buffers buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                         bool whole_gradient, MemoryKind grads_kind, MemoryKind moments_kind);

  // Whether span `index` is updated on the device.
  bool holds(size_t index) const { return at_[index] != kNotHere; }
  // ZeRO-1: each rank keeps and updates its part of every device-updated span.
  bool sharded() const { return shards_.has_value(); }
  // The device-updated spans, in layout order.
  const std::vector<size_t>& spans() const { return spans_; }

  // step(), before the device thread starts: the step has this many micro-batches.
  void begin_step(size_t micro_batches);

  // Device thread: where block `layer`'s backward of a step's only micro-batch writes.
  float* block_gradient(int layer) const;
  // Device thread, several micro-batches: adds one micro-batch's gradient of span `index` into the
  // span's sum (zeroed at the first), one float add per element, as every mode sums.
  void add(size_t index, const float* micro_batch, bool first);
  // Device thread: span `index`'s gradient this step, once its backward is done: the sum, or the
  // only micro-batch's (which a data-parallel run sums over the ranks in place).
  float* gradient(size_t index) const;
  // Consumer, several ranks without ZeRO-1, once span `index`'s gradient is final (`after`: the
  // device's fence after its last backward or add): the gradient summed over the ranks in place
  // (rank order, from +0), beside the device's work (collectives.start_sum_in_rank_order).
  // Returns the fence after which the sum is there.
  std::shared_ptr<const DeviceFence> start_sum_over_ranks(size_t index,
                                                          DeviceCollectives& collectives,
                                                          const DeviceFence& after);
  // Consumer, ZeRO-1, once span `index`'s gradient is final (on the CPU backend, whose device work
  // is done when issued): the gradient summed over the ranks into this rank's part only (rank
  // order, from +0).
  void reduce_scatter(size_t index);
  // Consumer, ZeRO-1, after every device-updated span's reduce_scatter: into span_sum_sq[index]
  // the sum of squares of each span's whole sum, from every rank's whole chunks added in the
  // order every mode adds them. Traced as "grad_norm" on `track`.
  void sums_of_squares_of_parts(std::vector<double>& span_sum_sq, TraceRecorder* trace, int track);

  // Device thread: AdamW on every device-updated span (ZeRO-1: on this rank's part, then every
  // rank's new weights gathered), span `index` in weights[index] (its fp32 weights in the device
  // copy) and, where compute_copies[index] is not null, writing the backend's bf16 compute copy in
  // the same pass; traced as "adamw ..." on `track`. Returns whether every span's compute copy was
  // written.
  bool update(const AdamWStep& adamw, const std::vector<float*>& weights,
              const std::vector<void*>& compute_copies, TraceRecorder* trace, int track);

  // A device-updated span's weights (from `weights`, its place in the device copy) and moments
  // into `out`; its moments from `in` (host memory laid out like the span, or coded). ZeRO-1: only
  // rank 0 reads moments, asking each other rank for its part (which it answers with
  // send_moments); every rank writes the whole span and keeps its part.
  void read_span(size_t index, const SpanState& out, const float* weights) const;
  void write_span(size_t index, const ConstSpanState& in);
  // ZeRO-1, a rank other than 0 (Schedule::serve_exports): its part of span `index`'s moments to
  // rank 0, which asked for them.
  void send_moments(size_t index) const;

 private:
  static constexpr size_t kNotHere = static_cast<size_t>(-1);
  // Span `index`'s own gradient buffer: a block's place in block_grads_, else its place in sums_.
  float* own_gradient(size_t index) const;
  int rank() const { return ranks_ != nullptr ? ranks_->rank() : 0; }
  int rank_count() const { return ranks_ != nullptr ? ranks_->size() : 1; }
  // Runs of consecutive device-updated spans whose places (`at`) follow each other in memory, each
  // handed to `run` as its first place and its layout elements [begin, end): one collective each
  // (gpu's plan: one for the whole model).
  template <class At, class Run>
  void for_each_run(At at, Run run) const;
  // The shards' bounds within layout elements [begin, end), from `begin`.
  std::vector<size_t> bounds_within(size_t begin, size_t end) const;

  Device& device_;
  const ParameterLayout& layout_;
  const MicroBatchGradients& gradients_;
  const Buffers buffers_;
  Communicator* const ranks_;  // several ranks; else null
  const std::optional<OptimizerShards> shards_;
  std::unique_ptr<DeviceCollectives> collectives_;  // ZeRO-1: its collectives in device memory
  const PackedMoments moments_;  // where each device-updated span's moments lie in moments_buffer_
  std::vector<size_t> spans_;
  std::vector<size_t> at_;        // per span: its place among the device-updated, or kNotHere
  std::vector<size_t> block_at_;  // per block: its offset in block_grads_, or kNotHere
  std::vector<size_t> sum_at_;    // per span: its offset in sums_, or kNotHere
  DeviceBuffer moments_buffer_;
  DeviceBuffer block_grads_;
  DeviceBuffer sums_;    // at the first step with several micro-batches
  bool summed_ = false;  // this step has several micro-batches (step() sets it)
};

}  // namespace layup
