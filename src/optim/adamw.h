// AdamW with decoupled weight decay (Loshchilov & Hutter), one contiguous span at a time.
//
// Matches torch.optim.AdamW: p <- p (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
// p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps). The gradient is multiplied by
// grad_scale first, which is how global-norm clipping is applied without a separate pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/parameter_layout.h"

namespace layup {

struct AdamWHyper {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// The values of one update: the hyperparameters at this step, its 1-based count t, and the
// clip factor to multiply every gradient by (1 when not clipping).
struct AdamWStep {
  AdamWHyper hyper;
  int64_t t = 1;
  float grad_scale = 1.0f;
};

// Updates `count` parameters in place; `decay` says whether weight decay applies to them.
void adamw_update(float* params, const float* grads, float* m, float* v, size_t count,
                  const AdamWStep& step, bool decay);

// Updates one span (embeddings, one block, or the final norm) whose buffers all start at the
// span's first element; weight decay is applied per tensor as the layout says.
void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                       const float* grads, float* m, float* v, const AdamWStep& step);

// Updates elements [first, first + count) of a span, the buffers starting at element `first`:
// the same bits adamw_update_span gives those elements (each element's update is its own), for a
// rank that owns part of the optimizer state (docs/parallel.md).
void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                            size_t count, float* params, const float* grads, float* m, float* v,
                            const AdamWStep& step);

}  // namespace layup
