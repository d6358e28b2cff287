// GPT-2 weight initialization, parallel and deterministic.
#include "model/init.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/rng.h"

namespace layup {

namespace {

// Fills x with N(0, std) in chunks, each drawn from its own stream derived from (seed, tensor,
// chunk), so the values do not depend on the number of threads.
void fill_normal(float* x, size_t count, float std, uint64_t seed, size_t tensor_index) {
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    Rng stream(seed);
    stream.set_state(Rng(seed ^ (tensor_index * 0x9E3779B97F4A7C15ull) ^ (c << 32)).next_u64());
    const size_t end = std::min(count, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i) x[i] = std * stream.normal();
  }
}

// Tensor `index` of the layout into `x` (its count floats). Each tensor's values depend only on
// the seed and the tensor's index, so a span can be initialized alone.
void init_tensor(const ParameterLayout& layout, size_t index, float* x, uint64_t seed) {
  const ModelConfig& config = layout.config();
  const TensorSpec& tensor = layout.tensors()[index];
  switch (tensor.init) {
    case TensorInit::kZeros:
      std::fill(x, x + tensor.count, 0.0f);
      break;
    case TensorInit::kOnes:
      std::fill(x, x + tensor.count, 1.0f);
      break;
    case TensorInit::kNormal:
      fill_normal(x, tensor.count, 0.02f, seed, index);
      break;
    case TensorInit::kResidualNormal:
      fill_normal(x, tensor.count, 0.02f / std::sqrt(2.0f * config.n_layer), seed, index);
      break;
    case TensorInit::kVocabularyNormal: {
      const size_t real_rows = static_cast<size_t>(config.vocab_size) * config.n_embd;
      fill_normal(x, real_rows, 0.02f, seed, index);
      std::fill(x + real_rows, x + tensor.count, 0.0f);
      break;
    }
  }
}

}  // namespace

void init_parameters(const ParameterLayout& layout, float* params, uint64_t seed) {
  for (size_t index = 0; index < layout.tensors().size(); ++index)
    init_tensor(layout, index, params + layout.tensors()[index].offset, seed);
}

void init_span_parameters(const ParameterLayout& layout, size_t index, float* span_params,
                          uint64_t seed) {
  const Span& span = layout.spans()[index];
  for (size_t tensor = 0; tensor < layout.tensors().size(); ++tensor) {
    const TensorSpec& spec = layout.tensors()[tensor];
    if (spec.offset >= span.offset && spec.offset < span.offset + span.count)
      init_tensor(layout, tensor, span_params + (spec.offset - span.offset), seed);
  }
}

}  // namespace layup
