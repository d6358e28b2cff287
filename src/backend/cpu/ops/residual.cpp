// Residual connection, forward and backward.
#include "backend/cpu/ops/residual.h"

namespace layup {

void residual_forward(float* out, const float* inp1, const float* inp2, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int N) {
#pragma omp parallel for simd schedule(static)
  for (int i = 0; i < N; ++i) {
    dinp1[i] += dout[i];
    dinp2[i] += dout[i];
  }
}

}  // namespace layup
