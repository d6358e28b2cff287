// Test support for the CPU ops: random tensors, central finite differences in double, and an
// elementwise comparison that reports the worst element. Used only by the *_test.cpp files.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"

namespace layup::op_test {

inline std::vector<float> random_vector(Rng& rng, size_t count, float scale = 1.0f,
                                        float offset = 0.0f) {
  std::vector<float> values(count);
  for (float& value : values) value = offset + scale * rng.normal();
  return values;
}

inline std::vector<double> to_double(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// d f / d x_i for every i by central differences, f evaluated in double. x is perturbed in place
// and restored.
inline std::vector<double> numeric_gradient(const std::function<double()>& f,
                                            std::vector<double>& x, double eps = 1e-6) {
  std::vector<double> gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double plus = f();
    x[i] = saved - eps;
    const double minus = f();
    x[i] = saved;
    gradient[i] = (plus - minus) / (2 * eps);
  }
  return gradient;
}

// Expects |actual[i] - expected[i]| <= atol + rtol * |expected[i]| for every i, and names the
// worst offender when not.
inline void expect_close(const float* actual, const std::vector<double>& expected, double atol,
                         double rtol, const std::string& what) {
  size_t worst = 0;
  double worst_excess = -INFINITY;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    const double excess =
        std::isnan(error) ? INFINITY : error - (atol + rtol * std::fabs(expected[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (expected.empty()) return;
  std::ostringstream message;
  message << what << ": worst element " << worst << " of " << expected.size() << " is "
          << actual[worst] << ", expected " << expected[worst] << " (atol " << atol << ", rtol "
          << rtol << ")";
  EXPECT_LE(worst_excess, 0.0) << message.str();
}

inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                         double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  expect_close(actual.data(), expected, atol, rtol, what);
}

// initial + gradient, elementwise: what an accumulating backward must leave behind.
inline std::vector<double> plus(const std::vector<float>& initial,
                                const std::vector<double>& gradient) {
  std::vector<double> sum(gradient.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = initial[i] + gradient[i];
  return sum;
}

}  // namespace layup::op_test
