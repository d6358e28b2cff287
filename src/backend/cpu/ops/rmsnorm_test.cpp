// RMS norm forward against a double-precision reference; backward against central finite
// differences of that reference.
#include "backend/cpu/ops/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

constexpr float kEps = 1e-6f;

// out = x / sqrt(mean(x^2) + eps) * w per row, in double; optionally rstd.
std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                      int N, int C, std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int n = 0; n < N; ++n) {
    double squares = 0.0;
    for (int c = 0; c < C; ++c) squares += x[n * C + c] * x[n * C + c];
    const double s = 1.0 / std::sqrt(squares / C + kEps);
    for (int c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * s * w[c];
    if (rstd) rstd->push_back(s);
  }
  return out;
}

struct RmsNormCase {
  int N, C;
};

class RmsNormOp : public ::testing::TestWithParam<RmsNormCase> {};

TEST_P(RmsNormOp, ForwardMatchesDoubleReference) {
  const auto [N, C] = GetParam();
  Rng rng(60);
  // No mean is subtracted, so an offset is just more signal; it still checks large rows.
  const std::vector<float> x = random_vector(rng, N * C, 2.0f, 5.0f);
  const std::vector<float> w = random_vector(rng, C, 0.3f, 1.0f);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  std::vector<double> rstd_expected;
  const std::vector<double> out_expected =
      rmsnorm_reference(to_double(x), to_double(w), N, C, &rstd_expected);
  expect_close(out, out_expected, 1e-6, 1e-6, "out");
  expect_close(rstd, rstd_expected, 0, 2e-7, "rstd");
}

// A row of zeros normalizes to zeros (rstd = 1/sqrt(eps)), without NaN, in both directions.
TEST(RmsNormZeroRow, StaysFinite) {
  const int C = 5;
  const std::vector<float> x(C, 0.0f), w(C, 1.5f), dout = {1, -2, 3, -4, 5};
  std::vector<float> out(C, 7.0f), rstd(1), dx(C, 0.0f), dw(C, 0.0f);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 1, C, kEps);
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), 1, C);
  EXPECT_FLOAT_EQ(rstd[0], 1.0f / std::sqrt(kEps));
  for (int c = 0; c < C; ++c) {
    EXPECT_EQ(out[c], 0.0f);
    EXPECT_EQ(dw[c], 0.0f);
    // At x = 0, y = x w / sqrt(eps) to first order: dx = dout w / sqrt(eps).
    EXPECT_FLOAT_EQ(dx[c], dout[c] * w[c] / std::sqrt(kEps));
  }
}

TEST_P(RmsNormOp, BackwardMatchesFiniteDifferences) {
  const auto [N, C] = GetParam();
  Rng rng(61);
  const std::vector<float> x = random_vector(rng, N * C, 1.5f, 0.5f);
  const std::vector<float> w = random_vector(rng, C, 0.3f, 1.0f);
  const std::vector<float> dout = random_vector(rng, N * C);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);

  // Start from nonzero gradients: the backward must add to them.
  const std::vector<float> dx_initial = random_vector(rng, N * C);
  const std::vector<float> dw_initial = random_vector(rng, C);
  std::vector<float> dx = dx_initial, dw = dw_initial;
  rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);

  std::vector<double> xd = to_double(x), wd = to_double(w);
  auto objective = [&] {
    const std::vector<double> y = rmsnorm_reference(xd, wd, N, C);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dx, plus(dx_initial, numeric_gradient(objective, xd)), 2e-6, 2e-6, "dinp");
  expect_close(dw, plus(dw_initial, numeric_gradient(objective, wd)), 2e-6, 2e-6, "dweight");
}

INSTANTIATE_TEST_SUITE_P(Sizes, RmsNormOp,
                         ::testing::Values(RmsNormCase{1, 1}, RmsNormCase{1, 3}, RmsNormCase{5, 13},
                                           RmsNormCase{7, 64}, RmsNormCase{33, 37}));

}  // namespace
}  // namespace layup
