// LayerMajorBuffers: what layer-major accumulation (docs/schedules.md, "Micro-batch accumulation")
// adds to offload and layup. Each micro-batch's backend state waits in a store of its own between
// its backward calls (its block inputs, the residual stream's gradient:
// ModelBackend::park_micro_batch), in host memory the device copies fastest (pinned on CUDA): N
// micro-batches' block inputs are as large as the device's budget for everything else at the
// sizes layer-major is for. On the device side, a micro-batch's backward writes a block's gradient
// into one block output before the device adds it into the block's sum, and a head span's into a
// head output of its own where its sum lies where one micro-batch's gradient lies otherwise (a head
// span the host updates; every head span in offload). A tied embedding keeps the head's part of
// every micro-batch until the input's part is added at the end of the backward: one embeddings
// span a micro-batch.
#pragma once

#include <cstddef>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {

class LayerMajorBuffers {
 public:
  // own_head_outputs: whether the embeddings (first) and the final norm (second) need an output of
  // their own (their sum lies where the backward would write one micro-batch's gradient).
  struct Shape {
    bool embeddings_output = true, final_norm_output = true;
    bool tied = false;  // the LM head is the token embedding (ModelConfig::tie_word_embeddings)
  };
  // `device` must outlive this.
  LayerMajorBuffers(Device& device, const ParameterLayout& layout, Shape shape,
                    MemoryKind grads_kind, MemoryKind stores_kind);

  // What it allocates for steps of `micro_batches`, stores of `state_bytes` each.
  static BufferList buffers(const ParameterLayout& layout, Shape shape, MemoryKind grads_kind,
                            MemoryKind stores_kind, int micro_batches, size_t state_bytes);
  // The shape of a schedule with `options`: the head spans updated on the device keep their sum
  // apart from one micro-batch's gradient (DeviceTier), every other one in its place.
  static Shape shape_of(Mode mode, const ParameterLayout& layout, const ScheduleOptions& options);

  // step(), before the device thread starts: room for `micro_batches` stores of `state_bytes`
  // (allocated at the first step that needs more).
  void begin_step(size_t micro_batches, size_t state_bytes);

  // Micro-batch k's store.
  void* store(size_t k) const;
  // Where one micro-batch's backward writes a block's gradient.
  float* block_output() const { return block_output_.data(); }
  // Where micro-batch k's backward writes head span `index`'s gradient (`index`: the embeddings,
  // 0, or the final norm, the last span), or null where it needs no output of its own.
  float* head_output(size_t index, size_t k) const;

 private:
  Device& device_;
  const ParameterLayout& layout_;
  const Shape shape_;
  const MemoryKind grads_kind_, stores_kind_;
  DeviceBuffer block_output_, final_norm_output_;
  std::vector<DeviceBuffer> embeddings_outputs_;  // one, or one a micro-batch where tied
  std::vector<DeviceBuffer> stores_;
  size_t state_bytes_ = 0;
};

}  // namespace layup
