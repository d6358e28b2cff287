// Fully connected layer, forward and backward, on Eigen's GEMM.
//
// With y = x W^T + b (x [N,IC], W [OC,IC], y [N,OC]) and upstream gradient dy:
//
//   dx = dy W        [N,IC]     (y_nj = sum_i x_ni W_ji, so dL/dx_ni = sum_j dy_nj W_ji)
//   dW = dy^T x      [OC,IC]    (dL/dW_ji = sum_n dy_nj x_ni)
//   db = sum_n dy_n  [OC]
//
// Eigen is built single-threaded (EIGEN_DONT_PARALLELIZE); each GEMM is cut here into one
// contiguous block of output rows or columns per OpenMP thread. Every output element is then
// computed whole by one thread, so results are deterministic for a given thread count.
#include "backend/cpu/ops/matmul.h"

#include <Eigen/Core>
#include <cstddef>
#include <vector>

#include "backend/cpu/ops/thread_split.h"

namespace layup {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixView = Eigen::Map<RowMajorMatrix>;
using ConstMatrixView = Eigen::Map<const RowMajorMatrix>;

// Output tiles are cut on multiples of this many rows or columns (a few SIMD registers wide).
constexpr int kTileGranularity = 16;

// c += a * b, with c's larger dimension shared out among the threads.
template <class Lhs, class Rhs>
void parallel_gemm_accumulate(MatrixView c, const Lhs& a, const Rhs& b) {
  const bool split_rows = c.rows() >= c.cols();
#pragma omp parallel
  {
    if (split_rows) {
      const IndexRange rows = my_share(static_cast<int>(c.rows()), kTileGranularity);
      if (rows.size() > 0)
        c.middleRows(rows.begin, rows.size()).noalias() +=
            a.middleRows(rows.begin, rows.size()) * b;
    } else {
      const IndexRange cols = my_share(static_cast<int>(c.cols()), kTileGranularity);
      if (cols.size() > 0)
        c.middleCols(cols.begin, cols.size()).noalias() +=
            a * b.middleCols(cols.begin, cols.size());
    }
  }
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    float* row = out + static_cast<size_t>(n) * OC;
    for (int o = 0; o < OC; ++o) row[o] = bias ? bias[o] : 0.0f;
  }
  parallel_gemm_accumulate(MatrixView(out, N, OC), ConstMatrixView(inp, N, IC),
                           ConstMatrixView(weight, OC, IC).transpose());
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC) {
  const ConstMatrixView dy(dout, N, OC);
  parallel_gemm_accumulate(MatrixView(dinp, N, IC), dy, ConstMatrixView(weight, OC, IC));
  parallel_gemm_accumulate(MatrixView(dweight, OC, IC), dy.transpose(),
                           ConstMatrixView(inp, N, IC));
  if (!dbias) return;
    // Column sums of dout: each thread owns a slice of the output features and sums every row.
#pragma omp parallel
  {
    const IndexRange features = my_share(OC, 8);
    std::vector<double> sum(features.size(), 0.0);
    for (int n = 0; n < N; ++n) {
      const float* row = dout + static_cast<size_t>(n) * OC;
      for (int o = features.begin; o < features.end; ++o) sum[o - features.begin] += row[o];
    }
    for (int o = features.begin; o < features.end; ++o)
      dbias[o] += static_cast<float>(sum[o - features.begin]);
  }
}

}  // namespace layup
