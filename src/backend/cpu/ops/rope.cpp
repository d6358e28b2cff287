// Rotary position embeddings on the CPU: the rotation both ways.
//
// Head channel i < D/2 and channel i + D/2 form a pair that turns by the angle t * inv_freq[i]
// at position t. As a 2x2 rotation R(a) applied to (x1, x2):
//
//   y1 = x1 cos a - x2 sin a          (Hugging Face: y = x cos + rotate_half(x) sin,
//   y2 = x2 cos a + x1 sin a           rotate_half(x) = [-x2, x1])
//
// The map is linear with matrix R(a), so its backward is R(a)^T = R(-a):
//
//   dx1 = dy1 cos a + dy2 sin a       dx2 = dy2 cos a - dy1 sin a
//
// The angles come from model/rope_tables.h.
#include "backend/cpu/ops/rope.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"

namespace layup {

namespace {

// Rotates every head of every row by R(sign * angle): sign +1 is the forward, -1 the backward.
void rotate_heads(float* out, const float* inp, const float* cos, const float* sin, int B, int T,
                  int heads, int head_dim, int row_stride, float sign) {
  const int half = head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < B * T; ++row) {
    const int t = row % T;
    const float* c = cos + static_cast<size_t>(t) * half;
    const float* s = sin + static_cast<size_t>(t) * half;
    for (int h = 0; h < heads; ++h) {
      const size_t offset =
          static_cast<size_t>(row) * row_stride + static_cast<size_t>(h) * head_dim;
      const float* x = inp + offset;
      float* y = out + offset;
      // Iteration i reads and writes channels i and i + half only, both read before either is
      // written: out may be inp, and the iterations may run as SIMD lanes.
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half], signed_sin = sign * s[i];
        y[i] = x1 * c[i] - x2 * signed_sin;
        y[i + half] = x2 * c[i] + x1 * signed_sin;
      }
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int B, int T,
                  int heads, int head_dim, int row_stride) {
  rotate_heads(out, inp, cos, sin, B, T, heads, head_dim, row_stride, 1.0f);
}

void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T,
                   int heads, int head_dim, int row_stride) {
  rotate_heads(dinp, dout, cos, sin, B, T, heads, head_dim, row_stride, -1.0f);
}

}  // namespace layup
