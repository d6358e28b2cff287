// The device-side buffers of layer-major accumulation (layer_major_buffers.h).
#include "schedule/layer_major_buffers.h"

#include <string>

#include "core/error.h"

namespace layup {

namespace {

size_t floats_of(size_t bytes) {
  return (bytes + sizeof(float) - 1) / sizeof(float);
}

PlannedAllocation block_output_buffer(const ParameterLayout& layout, MemoryKind kind) {
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.block().count * sizeof(float),
          "one micro-batch's block gradient (layer-major accumulation)"};
}

PlannedAllocation head_output_buffer(const ParameterLayout& layout, size_t index, MemoryKind kind) {
  const bool embeddings = layout.spans()[index].kind == SpanKind::kEmbeddings;
  return {MemorySide::kDevice, TensorClass::kWeightGrads, kind,
          layout.spans()[index].count * sizeof(float),
          std::string("one micro-batch's ") + (embeddings ? "embeddings'" : "final norm's") +
              " gradient (layer-major accumulation)"};
}

PlannedAllocation store_buffer(size_t state_bytes, MemoryKind kind) {
  return {MemorySide::kHost, TensorClass::kActivations, kind,
          floats_of(state_bytes) * sizeof(float),
          "a micro-batch's block inputs and residual gradient (layer-major accumulation)"};
}

// Embeddings outputs: one a micro-batch where tied (each keeps the head's part until the end of
// the backward), else one where the span needs one.
size_t embeddings_outputs(LayerMajorBuffers::Shape shape, size_t micro_batches) {
  return shape.tied ? micro_batches : shape.embeddings_output ? 1 : 0;
}

}  // namespace

LayerMajorBuffers::LayerMajorBuffers(Device& device, const ParameterLayout& layout, Shape shape,
                                     MemoryKind grads_kind, MemoryKind stores_kind)
    : device_(device),
      layout_(layout),
      shape_(shape),
      grads_kind_(grads_kind),
      stores_kind_(stores_kind) {}

BufferList LayerMajorBuffers::buffers(const ParameterLayout& layout, Shape shape,
                                      MemoryKind grads_kind, MemoryKind stores_kind,
                                      int micro_batches, size_t state_bytes) {
  const size_t last = layout.spans().size() - 1;
  BufferList list = {block_output_buffer(layout, grads_kind)};
  if (shape.final_norm_output) list.push_back(head_output_buffer(layout, last, grads_kind));
  for (size_t k = 0; k < embeddings_outputs(shape, static_cast<size_t>(micro_batches)); ++k)
    list.push_back(head_output_buffer(layout, 0, grads_kind));
  for (int k = 0; k < micro_batches; ++k) list.push_back(store_buffer(state_bytes, stores_kind));
  return list;
}

LayerMajorBuffers::Shape LayerMajorBuffers::shape_of(Mode mode, const ParameterLayout& layout,
                                                     const ScheduleOptions& options) {
  const auto on_device = [&](size_t index) {
    return mode == Mode::kLayup && !options.update_sites.empty() &&
           options.update_sites[index] == UpdateSite::kDevice;
  };
  return {!on_device(0), !on_device(layout.spans().size() - 1),
          layout.config().tie_word_embeddings};
}

void LayerMajorBuffers::begin_step(size_t micro_batches, size_t state_bytes) {
  LAYUP_CHECK(stores_.empty() || state_bytes == state_bytes_,
              "a micro-batch's store changed size between steps");
  state_bytes_ = state_bytes;
  if (block_output_.count() == 0) {
    block_output_ = device_.allocate(block_output_buffer(layout_, grads_kind_));
    if (shape_.final_norm_output)
      final_norm_output_ =
          device_.allocate(head_output_buffer(layout_, layout_.spans().size() - 1, grads_kind_));
  }
  while (embeddings_outputs_.size() < embeddings_outputs(shape_, micro_batches))
    embeddings_outputs_.push_back(device_.allocate(head_output_buffer(layout_, 0, grads_kind_)));
  while (stores_.size() < micro_batches)
    stores_.push_back(device_.allocate(store_buffer(state_bytes, stores_kind_)));
}

void* LayerMajorBuffers::store(size_t k) const {
  LAYUP_CHECK(k < stores_.size(), "micro-batch ", k, " has no store (", stores_.size(),
              " allocated)");
  return stores_[k].data();
}

float* LayerMajorBuffers::head_output(size_t index, size_t k) const {
  if (layout_.spans()[index].kind != SpanKind::kEmbeddings) return final_norm_output_.data();
  if (embeddings_outputs_.empty()) return nullptr;
  return embeddings_outputs_[shape_.tied ? k : 0].data();
}

}  // namespace layup
