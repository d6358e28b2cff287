// RMS normalization, forward and backward.
//
// Derivation of the backward, for one row (dropping n), with rstd = (mean_c(x_c^2) + eps)^(-1/2),
// xhat_c = x_c rstd and y_c = xhat_c w_c:
//
//   dw_c += dy_c * xhat_c              g_c = dy_c * w_c (= dL/dxhat_c)
//
// rstd depends on every x_j: d rstd / d x_j = -rstd^3 x_j / C = -rstd^2 xhat_j / C. Then
//
//   dL/dx_j = sum_c g_c d xhat_c / d x_j
//           = sum_c g_c (rstd delta_cj - x_c rstd^2 xhat_j / C)
//           = rstd (g_j - xhat_j mean_c(g_c xhat_c)).
//
// This is layer norm's backward without the mean_c(g_c) term (there is no mean to subtract). Row
// sums run in double, as in layernorm.cpp.
#include "backend/cpu/ops/rmsnorm.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/ops/thread_split.h"

namespace layup {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double squares = 0.0;
    for (int c = 0; c < C; ++c) squares += static_cast<double>(x[c]) * x[c];
    const float s = static_cast<float>(1.0 / std::sqrt(squares / C + eps));
    float* y = out + static_cast<size_t>(n) * C;
    // (x s) w, in the order Hugging Face's LlamaRMSNorm multiplies.
    for (int c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    const float s = rstd[n];
    double sum_g_xhat = 0.0;
    for (int c = 0; c < C; ++c) sum_g_xhat += static_cast<double>(dy[c] * weight[c]) * (x[c] * s);
    const float mean_g_xhat = static_cast<float>(sum_g_xhat / C);
    float* dx = dinp + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) dx[c] += s * (dy[c] * weight[c] - x[c] * s * mean_g_xhat);
  }

  // The weight gradient sums over rows: each thread owns a slice of channels and sums all rows
  // for it, so no two threads write one element.
#pragma omp parallel
  {
    const IndexRange channels = my_share(C, 8);
    std::vector<double> sum_w(channels.size(), 0.0);
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* dy = dout + static_cast<size_t>(n) * C;
      const float s = rstd[n];
      for (int c = channels.begin; c < channels.end; ++c)
        sum_w[c - channels.begin] += dy[c] * (x[c] * s);
    }
    for (int c = channels.begin; c < channels.end; ++c)
      dweight[c] += static_cast<float>(sum_w[c - channels.begin]);
  }
}

}  // namespace layup
