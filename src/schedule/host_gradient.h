// HostGradient: the fp32 gradient on the host of the spans the host updates (every span in
// `offload`; in `layup`, those ScheduleOptions::update_sites leaves on the host), packed in layout
// order, that `offload` and `layup` (with ScheduleOptions::host_gradient) add each micro-batch's
// gradient into, span by span, streamed out of device memory. Its buffers come from the device's
// allocate_host (pinned on CUDA), because the device copies into them.
//
// Copies: a span's first micro-batch lands straight in its accumulator in one transfer; later
// ones go through a staging buffer of two slots, a piece at a time (the next piece copied while
// the last is added), and are added with one float add per element in micro-batch order
// (optim/grad_norm.h chunks the passes), as every mode accumulates.
#pragma once

#include <cstddef>
#include <functional>
#include <mutex>

#include "backend/device.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "model/parameter_layout.h"
#include "optim/host_adamw.h"
#include "schedule/optimizer_shards.h"
#include "schedule/packed_spans.h"
#include "schedule/span_square_sums.h"

namespace layup {

class HostGradient {
 public:
  // `device`, `workers` (which run the element passes) and `device_sums` (the sums of squares the
  // device takes) must outlive this.
  // `spans`: the spans it keeps a gradient of.
  HostGradient(Device& device, const ParameterLayout& layout, const PackedSpans& spans,
               HostAdamW& workers, SpanSquareSums& device_sums);

  // What it allocates: the accumulator of `spans` and the staging of later micro-batches.
  struct Buffers {
    PlannedAllocation accumulator, staging;
    BufferList list() const { return {accumulator, staging}; }
  };
  static Buffers buffers(const ParameterLayout& layout, const PackedSpans& spans,
                         DeviceKinds kinds);

  // Span `index`'s accumulated gradient (a span it keeps).
  float* span(size_t index) const {
    LAYUP_CHECK(spans_.holds(index), "span ", index, " has no gradient on the host");
    return grads_.data() + spans_.at[index];
  }

  // Adds one micro-batch's gradient of span `index` (device memory laid out like the span,
  // complete once `written` has passed) into the span's accumulator, and calls `copied` (when
  // given) as soon as the gradient is out of device memory, so the device may overwrite it. first:
  // one transfer straight into the accumulator, which then becomes 0 + g element by element when
  // more micro-batches follow (bit for bit what zeroing and adding gives: a -0 gradient becomes
  // +0; with one micro-batch it stays g, as in gpu mode); later micro-batches go through the
  // staging buffer. last: also returns the sum of squares of the accumulated span (else 0),
  // grouped as sum_of_squares groups it: with one micro-batch (first and last) the device's, which
  // the caller started (SpanSquareSums::start) before `written`, so the host never reads the
  // gradient for it; after several, the host's, taken in the adding pass. Any thread may call it;
  // calls are serialized.
  double accumulate(const DeviceFence& written, const float* device_grad, size_t index, bool first,
                    bool last, const std::function<void()>& copied = {});

  // One micro-batch's gradient of span `index` straight into its accumulator in one transfer
  // (accumulate's first and last), for a caller that reads the span's sum of squares from the
  // device itself. Any thread may call it.
  void land(const DeviceFence& written, const float* device_grad, size_t index);

  // Data parallel: span `index`'s accumulated gradient (complete on this rank) replaced by every
  // rank's summed in rank order (Communicator::sum_in_rank_order), and the sum of squares of the
  // result, grouped as accumulate groups it, so that N ranks of one micro-batch give the bits
  // one process of N micro-batches gives. Every rank calls it for the same spans in the same
  // order, from one thread at a time.
  double sum_over_ranks(size_t index, Communicator& ranks);
  // ZeRO-1: the same sum, into this rank's part of the span only (its shard of `shards`; the rest
  // of the span is left undefined), and the sum of squares of the whole sum, from every rank's
  // chunks of it added in the order sum_over_ranks adds them (the same bits).
  double reduce_scatter(size_t index, Communicator& ranks, const OptimizerShards& shards);

 private:
  // Chunks [first_chunk, end_chunk) of a span of `count` floats over the workers, whole chunks
  // each, a few at a time: combine(begin, end) on their elements, then (when chunk_sums is not
  // null) their sums of squares of `squared` while they are in cache.
  void chunked_pass(const float* squared, size_t count, size_t first_chunk, size_t end_chunk,
                    const std::function<void(size_t, size_t)>& combine, double* chunk_sums);

  Device& device_;
  const ParameterLayout& layout_;
  const PackedSpans spans_;
  HostAdamW& workers_;
  SpanSquareSums& device_sums_;
  DeviceBuffer grads_;
  // Later micro-batches' gradients land here, a piece at a time. Used only inside accumulate,
  // whose later-micro-batch calls are serialized by staging_mutex_.
  DeviceBuffer staging_;
  std::mutex staging_mutex_;
};

}  // namespace layup
