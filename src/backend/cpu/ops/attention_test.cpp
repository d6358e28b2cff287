// Causal attention forward against a double-precision reference; backward against central finite
// differences of that reference.
#include "backend/cpu/ops/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

// out [B,T,Hq D] from qkv [B,T,(Hq+2Hkv)D], in double, written out the long way: query head h
// reads K/V head h / (Hq/Hkv).
std::vector<double> grouped_attention_reference(const std::vector<double>& qkv, int B, int T,
                                                int Hq, int Hkv, int D) {
  const int row = (Hq + 2 * Hkv) * D, group = Hq / Hkv;
  std::vector<double> out(static_cast<size_t>(B) * T * Hq * D, 0.0);
  auto q = [&](int b, int t, int h, int i) { return qkv[(b * T + t) * row + h * D + i]; };
  auto k = [&](int b, int t, int h, int i) { return qkv[(b * T + t) * row + (Hq + h) * D + i]; };
  auto v = [&](int b, int t, int h, int i) {
    return qkv[(b * T + t) * row + (Hq + Hkv + h) * D + i];
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> weights(t + 1);
        double max = -INFINITY, sum = 0.0;
        for (int u = 0; u <= t; ++u) {
          double score = 0.0;
          for (int i = 0; i < D; ++i) score += q(b, t, h, i) * k(b, u, h / group, i);
          weights[u] = score / std::sqrt(static_cast<double>(D));
          max = std::max(max, weights[u]);
        }
        for (int u = 0; u <= t; ++u) sum += weights[u] = std::exp(weights[u] - max);
        for (int u = 0; u <= t; ++u)
          for (int i = 0; i < D; ++i)
            out[((b * T + t) * Hq + h) * D + i] += weights[u] / sum * v(b, u, h / group, i);
      }
  return out;
}

// GPT-2's case: qkv [B,T,3C], NH heads of C/NH.
std::vector<double> attention_reference(const std::vector<double>& qkv, int B, int T, int C,
                                        int NH) {
  return grouped_attention_reference(qkv, B, T, NH, NH, C / NH);
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

struct GroupedAttentionCase {
  int B, T, Hq, Hkv, D;
};

class GroupedQueryAttentionOp : public ::testing::TestWithParam<GroupedAttentionCase> {};

TEST_P(GroupedQueryAttentionOp, ForwardMatchesDoubleReference) {
  const auto [B, T, Hq, Hkv, D] = GetParam();
  Rng rng(32);
  const std::vector<float> qkv = random_vector(rng, B * T * (Hq + 2 * Hkv) * D);
  std::vector<float> out(B * T * Hq * D, 123.0f), att(B * Hq * T * T, 123.0f);
  grouped_query_attention_forward(out.data(), att.data(), qkv.data(), B, T, Hq, Hkv, D);
  expect_close(out, grouped_attention_reference(to_double(qkv), B, T, Hq, Hkv, D), 1e-6, 1e-6,
               "out");
}

TEST_P(GroupedQueryAttentionOp, BackwardMatchesFiniteDifferences) {
  const auto [B, T, Hq, Hkv, D] = GetParam();
  const int row = (Hq + 2 * Hkv) * D;
  Rng rng(33);
  const std::vector<float> qkv = random_vector(rng, B * T * row);
  const std::vector<float> dout = random_vector(rng, B * T * Hq * D);
  std::vector<float> out(B * T * Hq * D), att(B * Hq * T * T);
  grouped_query_attention_forward(out.data(), att.data(), qkv.data(), B, T, Hq, Hkv, D);
  // Start from nonzero gradients: the backward must add to them.
  const std::vector<float> dqkv_initial = random_vector(rng, B * T * row);
  std::vector<float> dqkv = dqkv_initial;
  grouped_query_attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, Hq, Hkv,
                                   D);

  std::vector<double> qkvd = to_double(qkv);
  auto objective = [&] {
    const std::vector<double> y = grouped_attention_reference(qkvd, B, T, Hq, Hkv, D);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) sum += y[i] * dout[i];
    return sum;
  };
  expect_close(dqkv, plus(dqkv_initial, numeric_gradient(objective, qkvd)), 2e-6, 2e-6, "dqkv");
}

// Grouped-query attention is multi-head attention on K and V repeated per query head: the same
// products, so the same bits forward and for dQ; dK and dV are the sums of the copies' gradients
// (close, not bitwise: the grouped backward adds the copies inside one accumulation).
TEST_P(GroupedQueryAttentionOp, EqualsMultiHeadOnRepeatedKeysAndValues) {
  const auto [B, T, Hq, Hkv, D] = GetParam();
  const int group = Hq / Hkv, C = Hq * D, row = (Hq + 2 * Hkv) * D;
  Rng rng(34);
  const std::vector<float> qkv = random_vector(rng, B * T * row);
  const std::vector<float> dout = random_vector(rng, B * T * C);
  // qkv [B,T,3C] with K/V head j copied to heads j*group .. (j+1)*group-1.
  std::vector<float> repeated(B * T * 3 * C);
  for (int bt = 0; bt < B * T; ++bt) {
    std::copy_n(&qkv[bt * row], C, &repeated[bt * 3 * C]);
    for (int h = 0; h < Hq; ++h)
      for (int part = 1; part <= 2; ++part)
        std::copy_n(&qkv[bt * row + C + ((part - 1) * Hkv + h / group) * D], D,
                    &repeated[bt * 3 * C + part * C + h * D]);
  }
  std::vector<float> out(B * T * C), att(B * Hq * T * T), dqkv(B * T * row, 0.0f);
  grouped_query_attention_forward(out.data(), att.data(), qkv.data(), B, T, Hq, Hkv, D);
  grouped_query_attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, Hq, Hkv,
                                   D);
  std::vector<float> out_mh(B * T * C), att_mh(B * Hq * T * T), dqkv_mh(B * T * 3 * C, 0.0f);
  attention_forward(out_mh.data(), att_mh.data(), repeated.data(), B, T, C, Hq);
  attention_backward(dqkv_mh.data(), dout.data(), repeated.data(), att_mh.data(), B, T, C, Hq);

  EXPECT_EQ(out, out_mh);
  EXPECT_EQ(att, att_mh);
  std::vector<double> dkv_summed(B * T * 2 * Hkv * D, 0.0);
  for (int bt = 0; bt < B * T; ++bt) {
    EXPECT_TRUE(std::equal(&dqkv[bt * row], &dqkv[bt * row] + C, &dqkv_mh[bt * 3 * C]))
        << "dq of row " << bt;
    for (int h = 0; h < Hq; ++h)
      for (int part = 1; part <= 2; ++part)
        for (int i = 0; i < D; ++i)
          dkv_summed[(bt * 2 * Hkv + (part - 1) * Hkv + h / group) * D + i] +=
              dqkv_mh[bt * 3 * C + part * C + h * D + i];
  }
  std::vector<float> dkv;
  for (int bt = 0; bt < B * T; ++bt)
    dkv.insert(dkv.end(), &dqkv[bt * row + C], &dqkv[bt * row + row]);
  expect_close(dkv, dkv_summed, 1e-6, 1e-6, "dk, dv");
}

// {B, T, Hq, Hkv, D}: one token; groups of 2 and 3 with odd D; one K/V head for all (multi-query);
// Hkv = Hq (multi-head).
INSTANTIATE_TEST_SUITE_P(
    Sizes, GroupedQueryAttentionOp,
    ::testing::Values(GroupedAttentionCase{1, 1, 2, 1, 2}, GroupedAttentionCase{2, 5, 4, 2, 3},
                      GroupedAttentionCase{1, 7, 6, 2, 5}, GroupedAttentionCase{3, 6, 4, 1, 8},
                      GroupedAttentionCase{2, 9, 3, 3, 4}, GroupedAttentionCase{1, 17, 8, 2, 6}));

}  // namespace
}  // namespace layup
