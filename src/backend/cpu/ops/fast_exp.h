// exp for softmax arguments (x - max <= 0), written so the compiler vectorizes the loops using it.
//
// The standard library's expf is a call that no loop vectorizes, and Eigen's vectorized exp is
// paired with a scalar fallback that rounds differently (so a result would depend on a buffer's
// alignment). This one is plain arithmetic: the same operations in the vector body and in the
// scalar remainder of a loop, so every element gets the same bits wherever it sits.
//
// Method (Cephes expf): x = n ln2 + r with n = round(x / ln2), |r| <= ln2/2, ln2 split in two
// parts so n ln2 is subtracted exactly; exp(r) = 1 + r + r^2 P(r) with a degree-5 minimax P;
// exp(x) = 2^n exp(r), 2^n built directly in the exponent bits. Relative error < 1e-7 on
// [-87, 0.5]; below about -87 the result flushes to 0 instead of going subnormal (-inf gives 0).
// Arguments above ~88 are outside its domain (softmax never produces them).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace layup {

inline float exp_nonpositive(float x) {
  // exp(-104) is far below the smallest float; clamping there keeps the rounding trick below and
  // the integer conversion in range for any x, -inf included. The clamp compares the bits as
  // unsigned integers (a negative float's magnitude grows with its bits, and every non-negative
  // float's bits are smaller): a float compare would not be if-converted under the default
  // -ftrapping-math, and the loop would not vectorize.
  x = std::bit_cast<float>(std::min(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(-104.0f)));
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (in the default rounding
  // mode) without a call to rint that would stop vectorization.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float exp_r = p * r * r + r + 1.0f;
  // A biased exponent of 0 makes 2^n the float 0: exp of very negative x flushes to zero.
  const int32_t biased_exponent = std::max(static_cast<int32_t>(n) + 127, 0);
  return exp_r * std::bit_cast<float>(biased_exponent << 23);
}

}  // namespace layup
