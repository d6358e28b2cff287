// exp_nonpositive against the double-precision exp over its whole domain.
#include "backend/cpu/ops/fast_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace layup {
namespace {

TEST(FastExpOp, MatchesDoubleExpToAFewUlps) {
  const int count = 1 << 20;
  std::vector<float> x(count), y(count);
  for (int i = 0; i < count; ++i) x[i] = -87.0f + 87.5f * i / (count - 1);  // [-87, 0.5]
#pragma omp simd
  for (int i = 0; i < count; ++i) y[i] = exp_nonpositive(x[i]);
  double worst = 0.0;
  for (int i = 0; i < count; ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - expected) / expected);
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
}

TEST(FastExpOp, FlushesToZeroFarBelowRange) {
  EXPECT_EQ(exp_nonpositive(-100.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e4f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.0f);
}

}  // namespace
}  // namespace layup
