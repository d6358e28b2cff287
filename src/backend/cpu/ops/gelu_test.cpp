// GELU (tanh approximation) forward against a double-precision reference; backward against
// central finite differences of that reference.
#include "backend/cpu/ops/gelu.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

class GeluOp : public ::testing::TestWithParam<int> {};

// Normal inputs, plus the far tails where tanh saturates.
std::vector<float> gelu_inputs(int N, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x = random_vector(rng, N, 2.0f);
  if (N >= 4) {
    x[0] = -12.0f;
    x[1] = 12.0f;
    x[2] = 0.0f;
    x[3] = -3.5f;
  }
  return x;
}

TEST_P(GeluOp, ForwardMatchesDoubleReference) {
  const int N = GetParam();
  const std::vector<float> x = gelu_inputs(N, 40);
  std::vector<float> out(N);
  gelu_forward(out.data(), x.data(), N);
  std::vector<double> expected(N);
  for (int i = 0; i < N; ++i) expected[i] = gelu_reference(x[i]);
  expect_close(out, expected, 1e-6, 1e-5, "out");
}

TEST_P(GeluOp, BackwardMatchesFiniteDifferences) {
  const int N = GetParam();
  const std::vector<float> x = gelu_inputs(N, 41);
  Rng rng(42);
  const std::vector<float> dout = random_vector(rng, N);
  const std::vector<float> dx_initial = random_vector(rng, N);
  std::vector<float> dx = dx_initial;
  gelu_backward(dx.data(), x.data(), dout.data(), N);
  // Elementwise, so one central difference per element is its whole derivative.
  std::vector<double> expected(N);
  for (int i = 0; i < N; ++i) {
    const double eps = 1e-6;
    const double slope = (gelu_reference(x[i] + eps) - gelu_reference(x[i] - eps)) / (2 * eps);
    expected[i] = dx_initial[i] + slope * dout[i];
  }
  expect_close(dx, expected, 1e-5, 1e-5, "dinp");
}

// Eigen's scalar and vectorized tanh round differently; no element may depend on which one the
// buffer's address or the thread split happens to select.
TEST_P(GeluOp, ResultDoesNotDependOnAlignmentOrThreadCount) {
  const int N = GetParam();
  const std::vector<float> x = gelu_inputs(N, 43);
  Rng rng(44);
  const std::vector<float> dout = random_vector(rng, N);
  std::vector<float> reference_out(N), reference_dx(N, 0.0f);
  gelu_forward(reference_out.data(), x.data(), N);
  gelu_backward(reference_dx.data(), x.data(), dout.data(), N);

  const int threads = omp_get_max_threads();
  for (int offset = 1; offset < 8; offset += 3) {
    for (int thread_count : {1, 3}) {
      omp_set_num_threads(thread_count);
      // Shift every buffer by `offset` floats off its original alignment.
      std::vector<float> x_shifted(N + offset), dout_shifted(N + offset);
      std::copy(x.begin(), x.end(), x_shifted.begin() + offset);
      std::copy(dout.begin(), dout.end(), dout_shifted.begin() + offset);
      std::vector<float> out(N + offset), dx(N + offset, 0.0f);
      gelu_forward(out.data() + offset, x_shifted.data() + offset, N);
      gelu_backward(dx.data() + offset, x_shifted.data() + offset, dout_shifted.data() + offset, N);
      EXPECT_TRUE(std::equal(reference_out.begin(), reference_out.end(), out.begin() + offset))
          << "forward, offset " << offset << ", " << thread_count << " threads";
      EXPECT_TRUE(std::equal(reference_dx.begin(), reference_dx.end(), dx.begin() + offset))
          << "backward, offset " << offset << ", " << thread_count << " threads";
    }
  }
  omp_set_num_threads(threads);
}

// 10007 spans several of the backward's 4096-element chunks per thread.
INSTANTIATE_TEST_SUITE_P(Sizes, GeluOp, ::testing::Values(1, 3, 37, 10007));

}  // namespace
}  // namespace layup
