// SwiGLU, forward and backward.
//
// With sigma = sigmoid(g) and y = g sigma u:
//
//   dy/du = g sigma = silu(g)
//   dy/dg = u (sigma + g sigma (1 - sigma)) = u sigma (1 + g (1 - sigma))
//
// using sigma' = sigma (1 - sigma).
//
// sigmoid is evaluated from e = exp(-|g|) <= 1, never from an exp that overflows:
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0. exp_nonpositive (fast_exp.h) is
// plain arithmetic, so the element loops vectorize and every element gets the same bits in the
// vector body and the scalar remainder, for any buffer alignment and thread count.
#include "backend/cpu/ops/swiglu.h"

#include <cmath>
#include <cstddef>

#include "backend/cpu/ops/fast_exp.h"

namespace layup {
namespace {

inline float sigmoid(float g) {
  const float e = exp_nonpositive(-std::fabs(g));
  const float inv = 1.0f / (1.0f + e);
  return g >= 0.0f ? inv : e * inv;
}

}  // namespace

void swiglu_forward(float* out, const float* gate_up, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* gate = gate_up + static_cast<size_t>(n) * 2 * I;
    const float* up = gate + I;
    float* y = out + static_cast<size_t>(n) * I;
#pragma omp simd
    for (int i = 0; i < I; ++i) y[i] = gate[i] * sigmoid(gate[i]) * up[i];
  }
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int N, int I) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* gate = gate_up + static_cast<size_t>(n) * 2 * I;
    const float* up = gate + I;
    const float* dy = dout + static_cast<size_t>(n) * I;
    float* dgate = dgate_up + static_cast<size_t>(n) * 2 * I;
    float* dup = dgate + I;
#pragma omp simd
    for (int i = 0; i < I; ++i) {
      const float g = gate[i], s = sigmoid(g);
      dgate[i] += dy[i] * up[i] * s * (1.0f + g * (1.0f - s));
      dup[i] += dy[i] * g * s;
    }
  }
}

}  // namespace layup
