// The buffers of layer-major accumulation (layer_major_buffers.h).
#include "schedule/layer_major_buffers.h"

#include "core/error.h"

namespace layup {

namespace {

PlannedAllocation block_output_buffer(const ParameterLayout& layout, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.block().count * sizeof(float),
          "one micro-batch's block gradient (layer-major accumulation)"};
}

PlannedAllocation embeddings_output_buffer(const ParameterLayout& layout, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.embeddings().count * sizeof(float),
          "one micro-batch's gradient of the tied embedding (layer-major accumulation)"};
}

PlannedAllocation store_buffer(size_t state_bytes, MemoryKind kind) {
  return {MemorySide::kHost, TensorClass::kActivations, kind,
          (state_bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float),
          "a micro-batch's block inputs and residual gradient (layer-major accumulation)"};
}

PlannedAllocation hidden_buffer(size_t hidden_bytes, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kActivations, kind,
          (hidden_bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float),
          "a micro-batch's hidden state between its blocks' forwards (layer-major accumulation)"};
}

size_t embeddings_outputs(const ParameterLayout& layout, size_t micro_batches) {
  return layout.config().tie_word_embeddings ? micro_batches : 0;
}

}  // namespace

LayerMajorBuffers::LayerMajorBuffers(Device& device, const ParameterLayout& layout, bool whole,
                                     MemoryKind grads_kind, MemoryKind stores_kind,
                                     MemoryKind hidden_kind)
    : device_(device),
      layout_(layout),
      whole_(whole),
      grads_kind_(grads_kind),
      stores_kind_(stores_kind),
      hidden_kind_(hidden_kind) {}

BufferList LayerMajorBuffers::buffers(const ParameterLayout& layout, bool whole,
                                      MemoryKind grads_kind, MemoryKind stores_kind,
                                      MemoryKind hidden_kind, int micro_batches, size_t state_bytes,
                                      size_t hidden_bytes) {
  BufferList list;
  if (whole) list.push_back(block_output_buffer(layout, grads_kind));
  for (size_t k = 0; k < embeddings_outputs(layout, static_cast<size_t>(micro_batches)); ++k)
    list.push_back(embeddings_output_buffer(layout, grads_kind));
  for (int k = 0; k < micro_batches; ++k) list.push_back(store_buffer(state_bytes, stores_kind));
  for (int k = 0; k < micro_batches; ++k) list.push_back(hidden_buffer(hidden_bytes, hidden_kind));
  return list;
}

void LayerMajorBuffers::begin_step(size_t micro_batches, size_t state_bytes, size_t hidden_bytes) {
  LAYUP_CHECK((stores_.empty() || state_bytes == state_bytes_) &&
                  (hidden_.empty() || hidden_bytes == hidden_bytes_),
              "a micro-batch's store changed size between steps");
  state_bytes_ = state_bytes;
  hidden_bytes_ = hidden_bytes;
  if (whole_ && block_output_.count() == 0)
    block_output_ = device_.allocate(block_output_buffer(layout_, grads_kind_));
  while (embeddings_outputs_.size() < embeddings_outputs(layout_, micro_batches))
    embeddings_outputs_.push_back(device_.allocate(embeddings_output_buffer(layout_, grads_kind_)));
  while (stores_.size() < micro_batches)
    stores_.push_back(device_.allocate(store_buffer(state_bytes, stores_kind_)));
  while (hidden_.size() < micro_batches)
    hidden_.push_back(device_.allocate(hidden_buffer(hidden_bytes, hidden_kind_)));
}

void* LayerMajorBuffers::store(size_t k) const {
  LAYUP_CHECK(k < stores_.size(), "micro-batch ", k, " has no store (", stores_.size(),
              " allocated)");
  return stores_[k].data();
}

void* LayerMajorBuffers::hidden(size_t k) const {
  LAYUP_CHECK(k < hidden_.size(), "micro-batch ", k, " has no hidden state (", hidden_.size(),
              " allocated)");
  return hidden_[k].data();
}

float* LayerMajorBuffers::embeddings_output(size_t k) const {
  return k < embeddings_outputs_.size() ? embeddings_outputs_[k].data() : nullptr;
}

}  // namespace layup
