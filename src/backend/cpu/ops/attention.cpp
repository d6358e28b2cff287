// Causal self-attention, forward and backward.
//
// For one batch row and head (dropping b, h), with Q, K, V the [T, hd] slices of qkv and
// scale = 1/sqrt(hd):
//
//   S = scale Q K^T                            [T,T]
//   A = softmax over each row of S, restricted to u <= t (the causal mask)      saved as att
//   O = A V                                    [T,hd]
//
// Backward, given dO:
//
//   dA = dO V^T                                dV += A^T dO
//   dS[t,u] = A[t,u] (dA[t,u] - sum_u' A[t,u'] dA[t,u'])                  (softmax Jacobian)
//   dQ += scale dS K                           dK += scale dS^T Q
//
// The products run as Eigen GEMMs over whole [T,T] matrices: the masked half of A (and so of dS)
// is exactly zero. That is twice the multiply-adds of a triangular loop, and still more than twice
// as fast as one (measured at T=256, hd=32). Every (b, h) pair owns its own slices of q, k, v and
// their gradients, so threads split the work by (b, h) and never write the same element.
#include "backend/cpu/ops/attention.h"

#include <Eigen/Core>
#include <cmath>
#include <cstddef>

#include "backend/cpu/ops/fast_exp.h"

namespace layup {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixView = Eigen::Map<RowMajorMatrix>;
using ConstMatrixView = Eigen::Map<const RowMajorMatrix>;
// A [T, hd] slice of one head inside a [T, row_stride] buffer.
using HeadView = Eigen::Map<RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstHeadView = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Eigen::OuterStride<> qkv_stride(3 * C), out_stride(C);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* head = qkv + static_cast<size_t>(b) * T * 3 * C + h * hd;
      const ConstHeadView q(head, T, hd, qkv_stride), k(head + C, T, hd, qkv_stride);
      const ConstHeadView v(head + 2 * C, T, hd, qkv_stride);
      MatrixView a(att + (static_cast<size_t>(b) * NH + h) * T * T, T, T);
      a.noalias() = scale * (q * k.transpose());
      for (int t = 0; t < T; ++t) {
        float* row = a.row(t).data();
        const float max_score = a.row(t).head(t + 1).maxCoeff();
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int u = 0; u <= t; ++u) {
          row[u] = exp_nonpositive(row[u] - max_score);
          sum += row[u];
        }
        const float inv_sum = static_cast<float>(1.0 / sum);
        for (int u = 0; u <= t; ++u) row[u] *= inv_sum;
        for (int u = t + 1; u < T; ++u) row[u] = 0.0f;
      }
      HeadView o(out + static_cast<size_t>(b) * T * C + h * hd, T, hd, out_stride);
      o.noalias() = a * v;
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  const int hd = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Eigen::OuterStride<> qkv_stride(3 * C), out_stride(C);
#pragma omp parallel
  {
    RowMajorMatrix dscore(T, T);  // dA, then dS in place
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        const size_t head_offset = static_cast<size_t>(b) * T * 3 * C + h * hd;
        const float* head = qkv + head_offset;
        const ConstHeadView q(head, T, hd, qkv_stride), k(head + C, T, hd, qkv_stride);
        const ConstHeadView v(head + 2 * C, T, hd, qkv_stride);
        float* dhead = dqkv + head_offset;
        HeadView dq(dhead, T, hd, qkv_stride), dk(dhead + C, T, hd, qkv_stride);
        HeadView dv(dhead + 2 * C, T, hd, qkv_stride);
        const ConstMatrixView a(att + (static_cast<size_t>(b) * NH + h) * T * T, T, T);
        const ConstHeadView d_o(dout + static_cast<size_t>(b) * T * C + h * hd, T, hd, out_stride);

        dscore.noalias() = d_o * v.transpose();
        dv.noalias() += a.transpose() * d_o;
        for (int t = 0; t < T; ++t) {
          const float* a_row = a.row(t).data();
          float* d_row = dscore.row(t).data();
          double weighted = 0.0;  // sum_u A[t,u] dA[t,u]
#pragma omp simd reduction(+ : weighted)
          for (int u = 0; u <= t; ++u) weighted += static_cast<double>(a_row[u]) * d_row[u];
          const float mean = static_cast<float>(weighted);
          for (int u = 0; u <= t; ++u) d_row[u] = scale * a_row[u] * (d_row[u] - mean);
          for (int u = t + 1; u < T; ++u) d_row[u] = 0.0f;
        }
        dq.noalias() += dscore * k;
        dk.noalias() += dscore.transpose() * q;
      }
    }
  }
}

}  // namespace layup
