// Rotary embeddings: the frequencies (plain and Llama 3 scaled) and the cos/sin table against
// double-precision formulas; the rotation against a double reference, its backward against
// central finite differences, and in place against out of place.
#include "backend/cpu/ops/rope.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/cpu/ops/gradient_check.h"
#include "core/error.h"

namespace layup {
namespace {

using namespace op_test;

TEST(RopeFrequencies, PlainAreThetaToTheMinusTwoIOverD) {
  for (const int D : {2, 6, 64, 128}) {
    std::vector<float> inv_freq(D / 2);
    rope_inverse_frequencies(inv_freq.data(), D, 10000.0f, RopeScaling{});
    std::vector<double> expected(D / 2);
    for (int i = 0; i < D / 2; ++i) expected[i] = std::pow(10000.0, -2.0 * i / D);
    // Three float roundings (exponent, power, reciprocal), as transformers computes them.
    expect_close(inv_freq, expected, 0, 4e-7, "inv_freq, D " + std::to_string(D));
  }
}

// Llama 3.1's values: theta 500000, D 128, factor 8, low 1, high 4, original context 8192.
TEST(RopeFrequencies, Llama3ScalingKeepsFastStretchesSlowAndBlendsBetween) {
  const int D = 128;
  const RopeScaling scaling{true, 8.0f, 1.0f, 4.0f, 8192};
  std::vector<float> plain(D / 2), scaled(D / 2);
  rope_inverse_frequencies(plain.data(), D, 500000.0f, RopeScaling{});
  rope_inverse_frequencies(scaled.data(), D, 500000.0f, scaling);
  int kept = 0, stretched = 0, blended = 0;
  for (int i = 0; i < D / 2; ++i) {
    const double wavelength = 2 * std::numbers::pi / plain[i];
    if (wavelength < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelength > 8192.0 / 1) {
      EXPECT_NEAR(scaled[i], plain[i] / 8.0, 1e-7 * plain[i] / 8.0) << i;
      ++stretched;
    } else {
      // The blend weight s = (8192 / wavelength - 1) / 3 in (0, 1).
      const double s = (8192.0 / wavelength - 1.0) / 3.0;
      EXPECT_NEAR(scaled[i], (1 - s) * plain[i] / 8 + s * plain[i], 2e-7 * plain[i]) << i;
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8) << i;
      ++blended;
    }
  }
  // All three bands are populated at these settings, so each branch was checked.
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
  // Frequencies still fall strictly with i: the blend joins both sides without a step back.
  for (int i = 1; i < D / 2; ++i) EXPECT_LT(scaled[i], scaled[i - 1]) << i;
}

TEST(RopeFrequencies, RejectsWhatCannotRotate) {
  std::vector<float> inv_freq(8);
  EXPECT_THROW(rope_inverse_frequencies(inv_freq.data(), 7, 10000.0f, RopeScaling{}), Error);
  const RopeScaling equal_factors{true, 8.0f, 2.0f, 2.0f, 8192};
  EXPECT_THROW(rope_inverse_frequencies(inv_freq.data(), 16, 10000.0f, equal_factors), Error);
}

TEST(RopeCosSin, MatchesDoubleAnglesOfTheFloatFrequencies) {
  const int T = 37, D = 10;
  std::vector<float> inv_freq(D / 2), cos(T * D / 2), sin(T * D / 2);
  rope_inverse_frequencies(inv_freq.data(), D, 10000.0f, RopeScaling{});
  rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), T, D);
  std::vector<double> cos_expected, sin_expected;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < D / 2; ++i) {
      cos_expected.push_back(std::cos(t * static_cast<double>(inv_freq[i])));
      sin_expected.push_back(std::sin(t * static_cast<double>(inv_freq[i])));
    }
  // Angles up to 36 rad, rounded to float: an error of up to 36 * 2^-24 rad.
  expect_close(cos, cos_expected, 3e-6, 0, "cos");
  expect_close(sin, sin_expected, 3e-6, 0, "sin");
}

struct RopeCase {
  int B, T, heads, D, row_stride;
};

// The rotated heads of x [B*T, row_stride], in double; the other channels copied unchanged.
std::vector<double> rope_reference(const std::vector<double>& x, const std::vector<float>& cos,
                                   const std::vector<float>& sin, const RopeCase& shape) {
  const auto [B, T, heads, D, row_stride] = shape;
  std::vector<double> out = x;
  for (int row = 0; row < B * T; ++row)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < D / 2; ++i) {
        const int t = row % T, first = row * row_stride + h * D + i, second = first + D / 2;
        const double c = cos[t * D / 2 + i], s = sin[t * D / 2 + i];
        out[first] = x[first] * c - x[second] * s;
        out[second] = x[second] * c + x[first] * s;
      }
  return out;
}

// Which elements of a [B*T, row_stride] buffer the op rotates: the first heads * D of each row.
std::vector<bool> rotated_channels(const RopeCase& shape) {
  std::vector<bool> rotated(static_cast<size_t>(shape.B) * shape.T * shape.row_stride, false);
  for (int row = 0; row < shape.B * shape.T; ++row)
    std::fill_n(rotated.begin() + row * shape.row_stride, shape.heads * shape.D, true);
  return rotated;
}

class RopeOp : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    const RopeCase shape = GetParam();
    std::vector<float> inv_freq(shape.D / 2);
    rope_inverse_frequencies(inv_freq.data(), shape.D, 10000.0f, RopeScaling{});
    cos.resize(shape.T * shape.D / 2);
    sin.resize(shape.T * shape.D / 2);
    rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), shape.T, shape.D);
  }
  std::vector<float> cos, sin;
};

TEST_P(RopeOp, ForwardMatchesDoubleReference) {
  const RopeCase shape = GetParam();
  const auto [B, T, heads, D, row_stride] = shape;
  Rng rng(70);
  const std::vector<float> x = random_vector(rng, B * T * row_stride);
  // Out of place: the rotated heads of out start as NaN (position 0 rotates by nothing, so a
  // copy of x would hide a missed write); the other channels, a copy of x, must stay as they are.
  const std::vector<bool> rotated = rotated_channels(shape);
  std::vector<float> out = x;
  for (size_t i = 0; i < out.size(); ++i)
    if (rotated[i]) out[i] = NAN;
  rope_forward(out.data(), x.data(), cos.data(), sin.data(), B, T, heads, D, row_stride);
  expect_close(out, rope_reference(to_double(x), cos, sin, shape), 1e-6, 1e-6, "out");

  // In place gives the same bits.
  std::vector<float> in_place = x;
  rope_forward(in_place.data(), in_place.data(), cos.data(), sin.data(), B, T, heads, D,
               row_stride);
  EXPECT_EQ(in_place, out);
}

TEST_P(RopeOp, BackwardMatchesFiniteDifferences) {
  const RopeCase shape = GetParam();
  const auto [B, T, heads, D, row_stride] = shape;
  Rng rng(71);
  const std::vector<float> x = random_vector(rng, B * T * row_stride);
  const std::vector<float> dout = random_vector(rng, B * T * row_stride);
  // The backward overwrites the rotated heads of dinp and leaves the rest: start from values
  // that would show up if it added instead.
  const std::vector<float> dx_initial = random_vector(rng, B * T * row_stride);
  std::vector<float> dx = dx_initial;
  rope_backward(dx.data(), dout.data(), cos.data(), sin.data(), B, T, heads, D, row_stride);

  // The objective covers the rotated heads only; elsewhere dx must keep its initial values.
  std::vector<double> xd = to_double(x);
  const std::vector<bool> rotated = rotated_channels(shape);
  auto objective = [&] {
    const std::vector<double> y = rope_reference(xd, cos, sin, shape);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i)
      if (rotated[i]) sum += y[i] * dout[i];
    return sum;
  };
  std::vector<double> expected = numeric_gradient(objective, xd);
  for (size_t i = 0; i < expected.size(); ++i)
    if (!rotated[i]) expected[i] = dx_initial[i];
  expect_close(dx, expected, 2e-6, 2e-6, "dinp");

  // In place (the gradient rotated back where it lies) gives the same bits.
  std::vector<float> in_place = dout;
  for (size_t i = 0; i < in_place.size(); ++i)
    if (!rotated[i]) in_place[i] = dx_initial[i];
  rope_backward(in_place.data(), in_place.data(), cos.data(), sin.data(), B, T, heads, D,
                row_stride);
  EXPECT_EQ(in_place, dx);
}

// The backward undoes the forward: rotating by an angle and back returns the input.
TEST_P(RopeOp, BackwardInvertsForward) {
  const auto [B, T, heads, D, row_stride] = GetParam();
  Rng rng(72);
  const std::vector<float> x = random_vector(rng, B * T * row_stride);
  std::vector<float> y = x;
  rope_forward(y.data(), y.data(), cos.data(), sin.data(), B, T, heads, D, row_stride);
  rope_backward(y.data(), y.data(), cos.data(), sin.data(), B, T, heads, D, row_stride);
  expect_close(y, to_double(x), 1e-6, 1e-6, "round trip");
}

// {B, T, heads, D, row_stride}: a lone pair; q alone (row_stride = heads D) with odd sizes; the
// fused qkv of Hq = 4, Hkv = 2, D = 8 (q and k rotated, v left); and odd D/2 with extra channels.
INSTANTIATE_TEST_SUITE_P(Sizes, RopeOp,
                         ::testing::Values(RopeCase{1, 1, 1, 2, 2}, RopeCase{2, 5, 3, 6, 18},
                                           RopeCase{2, 7, 6, 8, 64}, RopeCase{3, 9, 5, 14, 77}));

}  // namespace
}  // namespace layup
