// Layer norm forward against a double-precision reference; backward against central finite
// differences of that reference.
#include "backend/cpu/ops/layernorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

constexpr float kEps = 1e-5f;

// out = (x - mean) / sqrt(var + eps) * w + b per row, in double; optionally mean and rstd.
std::vector<double> layernorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                        const std::vector<double>& b, int N, int C,
                                        std::vector<double>* mean = nullptr,
                                        std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0.0, v = 0.0;
    for (int c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double s = 1.0 / std::sqrt(v + kEps);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
    if (mean) mean->push_back(m);
    if (rstd) rstd->push_back(s);
  }
  return out;
}

struct LayerNormCase {
  int N, C;
};

class LayerNormOp : public ::testing::TestWithParam<LayerNormCase> {};

TEST_P(LayerNormOp, ForwardMatchesDoubleReference) {
  const auto [N, C] = GetParam();
  Rng rng(10);
  // An offset mean makes a one-pass variance cancel badly; the op must not.
  const std::vector<float> x = random_vector(rng, N * C, 2.0f, 30.0f);
  const std::vector<float> w = random_vector(rng, C, 0.3f, 1.0f), b = random_vector(rng, C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);
  std::vector<double> mean_expected, rstd_expected;
  const std::vector<double> out_expected = layernorm_reference(
      to_double(x), to_double(w), to_double(b), N, C, &mean_expected, &rstd_expected);
  expect_close(out, out_expected, 3e-6, 3e-6, "out");
  expect_close(mean, mean_expected, 0, 1e-7, "mean");
  expect_close(rstd, rstd_expected, 0, 2e-7, "rstd");
}

TEST_P(LayerNormOp, BackwardMatchesFiniteDifferences) {
  const auto [N, C] = GetParam();
  Rng rng(11);
  const std::vector<float> x = random_vector(rng, N * C, 1.5f, 0.5f);
  const std::vector<float> w = random_vector(rng, C, 0.3f, 1.0f), b = random_vector(rng, C);
  const std::vector<float> dout = random_vector(rng, N * C);
  std::vector<float> out(N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, kEps);

  // Start from nonzero gradients: the backward must add to them.
  const std::vector<float> dx_initial = random_vector(rng, N * C);
  const std::vector<float> dw_initial = random_vector(rng, C), db_initial = random_vector(rng, C);
  std::vector<float> dx = dx_initial, dw = dw_initial, db = db_initial;
  layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);

  std::vector<double> xd = to_double(x), wd = to_double(w), bd = to_double(b);
  auto objective = [&] {
    const std::vector<double> y = layernorm_reference(xd, wd, bd, N, C);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dx, plus(dx_initial, numeric_gradient(objective, xd)), 2e-6, 2e-6, "dinp");
  expect_close(dw, plus(dw_initial, numeric_gradient(objective, wd)), 2e-6, 2e-6, "dweight");
  expect_close(db, plus(db_initial, numeric_gradient(objective, bd)), 2e-6, 2e-6, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Sizes, LayerNormOp,
                         ::testing::Values(LayerNormCase{1, 3}, LayerNormCase{5, 13},
                                           LayerNormCase{7, 64}, LayerNormCase{33, 37}));

}  // namespace
}  // namespace layup
