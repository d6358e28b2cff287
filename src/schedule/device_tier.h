// DeviceTier: the spans the layup schedule updates on the device (ScheduleOptions::update_sites):
// their AdamW moments in device memory, their gradient kept there until the step's norm is known
// (summed there over micro-batches), and their update by the device's AdamW in the device copy of
// the weights, in the device's order before the next forward. See docs/schedules.md.
//
// Memory: the moments of every device-updated span packed into one buffer in the run's optimizer
// state kind, in layout order (PackedMoments). A device-updated block's gradient has a place of its
// own in one packed buffer (in the weight gradients' kind, as the slots): one micro-batch's
// backward writes it there, and with several it is their sum. The head spans' sum over several
// micro-batches lies in a packed buffer allocated at the first step that has several; with one the
// update reads the head's gradient where backward_head and backward_embeddings leave it.
//
// Threads: the device thread issues all of its device work; step() calls begin_step before the
// device thread starts and the state copies between steps.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "schedule/packed_moments.h"
#include "schedule/schedule.h"

namespace layup {

class TraceRecorder;

class DeviceTier {
 public:
  // `sites`: one per span, or empty (no span on the device). The head spans' gradients of one
  // micro-batch lie at embeddings_grad and final_norm_grad. `device` must outlive this.
  DeviceTier(Device& device, const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
             MemoryKind grads_kind, float* embeddings_grad, float* final_norm_grad,
             OptimizerStateKind kind = OptimizerStateKind::kFp32);

  // What it allocates for `sites` (none where no span is on the device): the packed moments and
  // block gradients at construction, the head spans' sum at the first step of several
  // micro-batches.
  struct Buffers {
    std::optional<PlannedAllocation> moments, block_grads, head_sums;
    // With head_sums when a step has several micro-batches.
    BufferList list(bool several_micro_batches) const;
  };
  static Buffers buffers(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                         MemoryKind grads_kind, DeviceKinds kinds,
                         OptimizerStateKind kind = OptimizerStateKind::kFp32);

  // Whether span `index` is updated on the device.
  bool holds(size_t index) const { return at_[index] != kNotHere; }
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
  // Device thread: AdamW on every device-updated span, span `index` in weights[index] (its fp32
  // weights in the device copy) and, where compute_copies[index] is not null, writing the
  // backend's bf16 compute copy in the same pass; traced as "adamw ..." on `track`.
  void update(const AdamWStep& adamw, const std::vector<float*>& weights,
              const std::vector<void*>& compute_copies, TraceRecorder* trace, int track);

  // A device-updated span's weights (from `weights`, its place in the device copy) and moments
  // into `out`; its moments from `in` (host memory laid out like the span, or coded).
  void read_span(size_t index, const SpanState& out, const float* weights) const;
  void write_span(size_t index, const ConstSpanState& in);

 private:
  static constexpr size_t kNotHere = static_cast<size_t>(-1);
  // Span `index`'s own gradient buffer: a block's place in block_grads_, a head span's in
  // head_sums_.
  float* own_gradient(size_t index) const;

  Device& device_;
  const ParameterLayout& layout_;
  const Buffers buffers_;
  const PackedMoments moments_;  // where each device-updated span's moments lie in moments_buffer_
  std::vector<size_t> spans_;
  std::vector<size_t> at_;           // per span: its place among the device-updated, or kNotHere
  std::vector<size_t> block_at_;     // per block: its offset in block_grads_, or kNotHere
  std::vector<size_t> head_sum_at_;  // per span: a head span's offset in head_sums_, or kNotHere
  size_t head_sum_count_ = 0;
  float* head_grads_[2];  // one micro-batch's: the embeddings', the final norm's
  DeviceBuffer moments_buffer_;
  DeviceBuffer block_grads_;
  DeviceBuffer head_sums_;  // at the first step with several micro-batches
  bool summed_ = false;     // this step has several micro-batches (step() sets it)
};

}  // namespace layup
