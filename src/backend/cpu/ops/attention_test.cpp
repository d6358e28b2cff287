// Causal attention forward against a double-precision reference; backward against central finite
// differences of that reference.
#include "backend/cpu/ops/attention.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

// out [B,T,C] from qkv [B,T,3C], in double, written out the long way.
std::vector<double> attention_reference(const std::vector<double>& qkv, int B, int T, int C,
                                        int NH) {
  const int hd = C / NH;
  std::vector<double> out(static_cast<size_t>(B) * T * C, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(b * T + t) * 3 * C + part * C + h * hd + i];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> weights(t + 1);
        double max = -INFINITY, sum = 0.0;
        for (int u = 0; u <= t; ++u) {
          double score = 0.0;
          for (int i = 0; i < hd; ++i) score += at(b, t, 0, h, i) * at(b, u, 1, h, i);
          weights[u] = score / std::sqrt(static_cast<double>(hd));
          max = std::max(max, weights[u]);
        }
        for (int u = 0; u <= t; ++u) sum += weights[u] = std::exp(weights[u] - max);
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < hd; ++i)
            out[(b * T + t) * C + h * hd + i] += weights[u] / sum * at(b, u, 2, h, i);
      }
  return out;
}

struct AttentionCase {
  int B, T, C, NH;
};

class AttentionOp : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionOp, ForwardMatchesDoubleReference) {
  const auto [B, T, C, NH] = GetParam();
  Rng rng(30);
  const std::vector<float> qkv = random_vector(rng, B * T * 3 * C);
  std::vector<float> out(B * T * C, 123.0f), att(B * NH * T * T, 123.0f);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  expect_close(out, attention_reference(to_double(qkv), B, T, C, NH), 1e-6, 1e-6, "out");
  // Each saved row is a distribution over the visible positions and exactly zero beyond.
  for (int row = 0; row < B * NH * T; ++row) {
    const int t = row % T;
    double sum = 0.0;
    for (int u = 0; u < T; ++u) {
      if (u <= t)
        sum += att[row * T + u];
      else
        ASSERT_EQ(att[row * T + u], 0.0f) << "row " << row << " u " << u;
    }
    ASSERT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
}

TEST_P(AttentionOp, BackwardMatchesFiniteDifferences) {
  const auto [B, T, C, NH] = GetParam();
  Rng rng(31);
  const std::vector<float> qkv = random_vector(rng, B * T * 3 * C);
  const std::vector<float> dout = random_vector(rng, B * T * C);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  const std::vector<float> dqkv_initial = random_vector(rng, B * T * 3 * C);
  std::vector<float> dqkv = dqkv_initial;
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);

  std::vector<double> qkvd = to_double(qkv);
  auto objective = [&] {
    const std::vector<double> y = attention_reference(qkvd, B, T, C, NH);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dqkv, plus(dqkv_initial, numeric_gradient(objective, qkvd)), 2e-6, 2e-6, "dqkv");
}

INSTANTIATE_TEST_SUITE_P(Sizes, AttentionOp,
                         ::testing::Values(AttentionCase{1, 1, 4, 2}, AttentionCase{1, 6, 5, 1},
                                           AttentionCase{2, 5, 6, 3}, AttentionCase{3, 7, 10, 2},
                                           AttentionCase{2, 17, 24, 3}));

}  // namespace
}  // namespace layup
