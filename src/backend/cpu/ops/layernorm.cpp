// Layer normalization, forward and backward.
//
// Derivation of the backward, for one row (dropping n), with xhat_c = (x_c - mean) * rstd and
// y_c = xhat_c * w_c + b_c:
//
//   db_c += dy_c                 dw_c += dy_c * xhat_c              g_c = dy_c * w_c (= dL/dxhat_c)
//
// mean and rstd depend on every x_j: d mean / d x_j = 1/C and d rstd / d x_j = -rstd^3 (x_j -
// mean)/C = -rstd^2 xhat_j / C. Then
//
//   dL/dx_j = sum_c g_c d xhat_c / d x_j
//           = sum_c g_c (rstd (delta_cj - 1/C) - (x_c - mean) rstd^2 xhat_j / C)
//           = rstd (g_j - mean_c(g_c) - xhat_j mean_c(g_c xhat_c)).
//
// Row statistics are summed in double: cheap at these widths, and it keeps the variance of rows
// with a large mean from cancelling.
#include "backend/cpu/ops/layernorm.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/ops/thread_split.h"

namespace layup {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    double sum = 0.0;
    for (int c = 0; c < C; ++c) sum += x[c];
    const double row_mean = sum / C;
    double squares = 0.0;
    for (int c = 0; c < C; ++c) {
      const double centered = x[c] - row_mean;
      squares += centered * centered;
    }
    const float m = static_cast<float>(row_mean);
    const float s = static_cast<float>(1.0 / std::sqrt(squares / C + eps));
    float* y = out + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + static_cast<size_t>(n) * C;
    const float* dy = dout + static_cast<size_t>(n) * C;
    const float m = mean[n], s = rstd[n];
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int c = 0; c < C; ++c) {
      const float g = dy[c] * weight[c];
      sum_g += g;
      sum_g_xhat += static_cast<double>(g) * ((x[c] - m) * s);
    }
    const float mean_g = static_cast<float>(sum_g / C);
    const float mean_g_xhat = static_cast<float>(sum_g_xhat / C);
    float* dx = dinp + static_cast<size_t>(n) * C;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      dx[c] += s * (dy[c] * weight[c] - mean_g - xhat * mean_g_xhat);
    }
  }

  // Weight and bias gradients sum over rows: each thread owns a slice of channels and sums all
  // rows for it, so no two threads write one element.
#pragma omp parallel
  {
    const IndexRange channels = my_share(C, 8);
    std::vector<double> sum_w(channels.size(), 0.0), sum_b(channels.size(), 0.0);
    for (int n = 0; n < N; ++n) {
      const float* x = inp + static_cast<size_t>(n) * C;
      const float* dy = dout + static_cast<size_t>(n) * C;
      const float m = mean[n], s = rstd[n];
      for (int c = channels.begin; c < channels.end; ++c) {
        sum_w[c - channels.begin] += dy[c] * ((x[c] - m) * s);
        sum_b[c - channels.begin] += dy[c];
      }
    }
    for (int c = channels.begin; c < channels.end; ++c) {
      dweight[c] += static_cast<float>(sum_w[c - channels.begin]);
      dbias[c] += static_cast<float>(sum_b[c - channels.begin]);
    }
  }
}

}  // namespace layup
