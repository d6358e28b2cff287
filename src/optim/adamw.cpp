// AdamW update loops.
#include "optim/adamw.h"

#include <cmath>

namespace layup {

void adamw_update(float* params, const float* grads, float* m, float* v, size_t count,
                  const AdamWStep& step, bool decay) {
  const AdamWHyper& h = step.hyper;
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step.t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step.t);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, scale = step.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i] * scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    params[i] = params[i] * decay_factor - step_size * m_i / (std::sqrt(v_i) * inv_sqrt_bc2 + eps);
  }
}

void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                       const float* grads, float* m, float* v, const AdamWStep& step) {
  for (const TensorSpec& tensor : layout.tensors_in(span)) {
    const size_t at = tensor.offset_in_span;
    adamw_update(params + at, grads + at, m + at, v + at, tensor.count, step, tensor.weight_decay);
  }
}

}  // namespace layup
