// SwiGLU forward against a double-precision reference; backward against central finite
// differences of that reference; results independent of alignment and thread count.
#include "backend/cpu/ops/swiglu.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

// out [N,I] = silu(gate) * up from gate_up [N,2I], in double.
std::vector<double> swiglu_reference(const std::vector<double>& gate_up, int N, int I) {
  std::vector<double> out(static_cast<size_t>(N) * I);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < I; ++i) {
      const double g = gate_up[n * 2 * I + i], u = gate_up[n * 2 * I + I + i];
      out[n * I + i] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

struct SwiGluCase {
  int N, I;
};

// Normal gates and ups, plus gates in sigmoid's saturated tails and at zero.
std::vector<float> swiglu_inputs(int N, int I, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> gate_up = random_vector(rng, static_cast<size_t>(N) * 2 * I, 2.0f);
  const float gates[] = {-100.0f, 100.0f, 0.0f, -20.0f, 20.0f, -5.0f};
  for (int i = 0; i < std::min(I, 6); ++i) gate_up[i] = gates[i];
  return gate_up;
}

class SwiGluOp : public ::testing::TestWithParam<SwiGluCase> {};

TEST_P(SwiGluOp, ForwardMatchesDoubleReference) {
  const auto [N, I] = GetParam();
  const std::vector<float> gate_up = swiglu_inputs(N, I, 80);
  std::vector<float> out(N * I, NAN);
  swiglu_forward(out.data(), gate_up.data(), N, I);
  expect_close(out, swiglu_reference(to_double(gate_up), N, I), 1e-6, 1e-6, "out");
}

TEST_P(SwiGluOp, BackwardMatchesFiniteDifferences) {
  const auto [N, I] = GetParam();
  const std::vector<float> gate_up = swiglu_inputs(N, I, 81);
  Rng rng(82);
  const std::vector<float> dout = random_vector(rng, N * I);
  // Start from nonzero gradients: the backward must add to them.
  const std::vector<float> dgate_up_initial = random_vector(rng, N * 2 * I);
  std::vector<float> dgate_up = dgate_up_initial;
  swiglu_backward(dgate_up.data(), dout.data(), gate_up.data(), N, I);

  std::vector<double> gate_up_d = to_double(gate_up);
  auto objective = [&] {
    const std::vector<double> y = swiglu_reference(gate_up_d, N, I);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dgate_up, plus(dgate_up_initial, numeric_gradient(objective, gate_up_d)), 2e-6, 2e-6,
               "dgate_up");
}

TEST_P(SwiGluOp, ResultDoesNotDependOnAlignmentOrThreadCount) {
  const auto [N, I] = GetParam();
  const std::vector<float> gate_up = swiglu_inputs(N, I, 83);
  Rng rng(84);
  const std::vector<float> dout = random_vector(rng, N * I);
  std::vector<float> reference_out(N * I), reference_d(N * 2 * I, 0.0f);
  swiglu_forward(reference_out.data(), gate_up.data(), N, I);
  swiglu_backward(reference_d.data(), dout.data(), gate_up.data(), N, I);

  const int threads = omp_get_max_threads();
  for (int offset = 1; offset < 8; offset += 3) {
    for (int thread_count : {1, 3}) {
      omp_set_num_threads(thread_count);
      // Shift every buffer by `offset` floats off its original alignment.
      std::vector<float> gate_up_shifted(gate_up.size() + offset),
          dout_shifted(dout.size() + offset);
      std::copy(gate_up.begin(), gate_up.end(), gate_up_shifted.begin() + offset);
      std::copy(dout.begin(), dout.end(), dout_shifted.begin() + offset);
      std::vector<float> out(N * I + offset), d(N * 2 * I + offset, 0.0f);
      swiglu_forward(out.data() + offset, gate_up_shifted.data() + offset, N, I);
      swiglu_backward(d.data() + offset, dout_shifted.data() + offset,
                      gate_up_shifted.data() + offset, N, I);
      EXPECT_TRUE(std::equal(reference_out.begin(), reference_out.end(), out.begin() + offset))
          << "forward, offset " << offset << ", " << thread_count << " threads";
      EXPECT_TRUE(std::equal(reference_d.begin(), reference_d.end(), d.begin() + offset))
          << "backward, offset " << offset << ", " << thread_count << " threads";
    }
  }
  omp_set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwiGluOp,
                         ::testing::Values(SwiGluCase{1, 1}, SwiGluCase{3, 7}, SwiGluCase{5, 37},
                                           SwiGluCase{2, 200}));

}  // namespace
}  // namespace layup
