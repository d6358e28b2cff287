// LayerMajorBuffers: what layer-major accumulation (docs/schedules.md, "Micro-batch accumulation")
// adds to offload and layup. Each micro-batch's backend state waits in a store of its own between
// its backward calls (its block inputs, the residual stream's gradient:
// ModelBackend::park_micro_batch), in host memory the device copies fastest (pinned on CUDA): N
// micro-batches' block inputs are as large as the device's budget for everything else at the
// sizes layer-major is for. During the layer-major forward each micro-batch's residual stream
// waits between its blocks in a hidden state in the device's memory (ModelBackend::forward_block:
// [B*T, C] activations a micro-batch). On the device side, offload's backward of one micro-batch
// writes a block's gradient into one block output before the device adds it into the block's part
// of the whole gradient (layup takes turns in its two slots instead); and a tied embedding keeps
// the LM head's part of every micro-batch until the input's part is added at the end of the
// backward: one embeddings span a micro-batch (an untied head's part is zeros).
#pragma once

#include <cstddef>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"

namespace layup {

class LayerMajorBuffers {
 public:
  // `device` must outlive this.
  // whole: the schedule sums blocks into the whole-model gradient (offload), and needs the block
  // output.
  LayerMajorBuffers(Device& device, const ParameterLayout& layout, bool whole,
                    MemoryKind grads_kind, MemoryKind stores_kind, MemoryKind hidden_kind);

  // What it allocates for steps of `micro_batches`: stores of `state_bytes` each, hidden states of
  // `hidden_bytes`.
  static BufferList buffers(const ParameterLayout& layout, bool whole, MemoryKind grads_kind,
                            MemoryKind stores_kind, MemoryKind hidden_kind, int micro_batches,
                            size_t state_bytes, size_t hidden_bytes);

  // step(), before the device thread starts: room for `micro_batches` micro-batches, stores of
  // `state_bytes` and hidden states of `hidden_bytes` (allocated at the first step that needs
  // more).
  void begin_step(size_t micro_batches, size_t state_bytes, size_t hidden_bytes);

  // Micro-batch k's store.
  void* store(size_t k) const;
  // Micro-batch k's hidden state (its residual stream between two blocks' forwards).
  void* hidden(size_t k) const;
  // Where one micro-batch's backward writes a block's gradient (offload).
  float* block_output() const { return block_output_.data(); }
  // Where micro-batch k's backward writes a tied embedding's gradient; null for an untied one.
  float* embeddings_output(size_t k) const;

 private:
  Device& device_;
  const ParameterLayout& layout_;
  const bool whole_;
  const MemoryKind grads_kind_, stores_kind_, hidden_kind_;
  DeviceBuffer block_output_;
  std::vector<DeviceBuffer> embeddings_outputs_;  // tied: one a micro-batch
  std::vector<DeviceBuffer> stores_, hidden_;
  size_t state_bytes_ = 0, hidden_bytes_ = 0;
};

}  // namespace layup
