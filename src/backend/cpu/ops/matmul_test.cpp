// Matmul forward against a double-precision reference; backward against central finite
// differences of that reference. Sizes exercise both ways the GEMM is split among threads.
#include "backend/cpu/ops/matmul.h"

#include <gtest/gtest.h>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

std::vector<double> matmul_reference(const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>* b, int N, int IC, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double sum = b ? (*b)[o] : 0.0;
      for (int i = 0; i < IC; ++i) sum += x[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = sum;
    }
  return out;
}

struct MatmulCase {
  int N, IC, OC;
  bool bias;
};

class MatmulOp : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulOp, ForwardMatchesDoubleReference) {
  const auto [N, IC, OC, has_bias] = GetParam();
  Rng rng(20);
  const std::vector<float> x = random_vector(rng, N * IC), w = random_vector(rng, OC * IC);
  const std::vector<float> b = random_vector(rng, OC);
  std::vector<float> out(N * OC, 123.0f);  // garbage: the forward overwrites
  matmul_forward(out.data(), x.data(), w.data(), has_bias ? b.data() : nullptr, N, IC, OC);
  const std::vector<double> bd = to_double(b);
  expect_close(out,
               matmul_reference(to_double(x), to_double(w), has_bias ? &bd : nullptr, N, IC, OC),
               3e-6, 3e-6, "out");
}

TEST_P(MatmulOp, BackwardMatchesFiniteDifferences) {
  const auto [N, IC, OC, has_bias] = GetParam();
  Rng rng(21);
  const std::vector<float> x = random_vector(rng, N * IC), w = random_vector(rng, OC * IC);
  const std::vector<float> b = random_vector(rng, OC), dout = random_vector(rng, N * OC);
  const std::vector<float> dx_initial = random_vector(rng, N * IC);
  const std::vector<float> dw_initial = random_vector(rng, OC * IC);
  const std::vector<float> db_initial = random_vector(rng, OC);
  std::vector<float> dx = dx_initial, dw = dw_initial, db = db_initial;
  matmul_backward(dx.data(), dw.data(), has_bias ? db.data() : nullptr, dout.data(), x.data(),
                  w.data(), N, IC, OC);

  std::vector<double> xd = to_double(x), wd = to_double(w), bd = to_double(b);
  auto objective = [&] {
    const std::vector<double> y = matmul_reference(xd, wd, has_bias ? &bd : nullptr, N, IC, OC);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dx, plus(dx_initial, numeric_gradient(objective, xd)), 1e-5, 1e-6, "dinp");
  expect_close(dw, plus(dw_initial, numeric_gradient(objective, wd)), 1e-5, 1e-6, "dweight");
  if (has_bias)
    expect_close(db, plus(db_initial, numeric_gradient(objective, bd)), 1e-5, 1e-6, "dbias");
  else
    EXPECT_EQ(db, db_initial);
}

INSTANTIATE_TEST_SUITE_P(Sizes, MatmulOp,
                         ::testing::Values(MatmulCase{1, 1, 1, true}, MatmulCase{1, 3, 5, true},
                                           MatmulCase{7, 13, 11, true},
                                           MatmulCase{37, 19, 70, true},
                                           MatmulCase{70, 5, 3, false},
                                           MatmulCase{9, 24, 67, false}));

}  // namespace
}  // namespace layup
