// The AdamW arithmetic on one element and on the lanes of each SIMD width, shared by the fp32
// loops (optim/adamw_simd.cpp) and the compact-state loops (optim/adamw_state.cpp), so that every
// loop of every state kind updates an element with the same operations in the same order (see
// adamw_simd.h). Include it only from files compiled with -ffp-contract=off (CMakeLists.txt):
// fused into FMAs, these products and sums would round differently.
#pragma once

#include <cmath>

#include "optim/adamw_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace layup {

// One element: the new p, m and v from the old ones and the gradient. The operand order of each
// product and sum is the one every level follows.
inline void adamw_lane(float& p, float grad, float& m, float& v, const AdamWConstants& c) {
  const float g = grad * c.grad_scale;
  const float m_i = c.beta1 * m + c.one_minus_beta1 * g;
  const float v_i = c.beta2 * v + c.one_minus_beta2 * g * g;
  p = p * c.decay_factor -
      c.step_size * m_i / (std::sqrt(v_i) * c.inv_sqrt_bias_correction2 + c.eps);
  m = m_i;
  v = v_i;
}

#if defined(__x86_64__)

// Eight elements in the lanes of AVX registers. _mm256_sqrt_ps and _mm256_div_ps are correctly
// rounded, as sqrtss and divss are; the approximations (_mm256_rsqrt_ps, _mm256_rcp_ps) would not
// be. Operand order of each product and sum follows the scalar expression.
__attribute__((target("avx2"))) inline void adamw8(__m256& p, __m256 grad, __m256& m, __m256& v,
                                                   const AdamWConstants& c) {
  const __m256 g = _mm256_mul_ps(grad, _mm256_set1_ps(c.grad_scale));
  m = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c.beta1), m),
                    _mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta1), g));
  v = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c.beta2), v),
                    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta2), g), g));
  const __m256 denominator =
      _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(c.inv_sqrt_bias_correction2)),
                    _mm256_set1_ps(c.eps));
  p = _mm256_sub_ps(_mm256_mul_ps(p, _mm256_set1_ps(c.decay_factor)),
                    _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c.step_size), m), denominator));
}

__attribute__((target("avx512f"))) inline void adamw16(__m512& p, __m512 grad, __m512& m, __m512& v,
                                                       const AdamWConstants& c) {
  const __m512 g = _mm512_mul_ps(grad, _mm512_set1_ps(c.grad_scale));
  m = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c.beta1), m),
                    _mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta1), g));
  v = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c.beta2), v),
                    _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta2), g), g));
  // _mm512_mask_sqrt_ps with every lane selected is _mm512_sqrt_ps; GCC 12's _mm512_sqrt_ps
  // trips a false -Wmaybe-uninitialized (its _mm512_undefined_ps, GCC bug 105593).
  const __m512 root = _mm512_mask_sqrt_ps(v, static_cast<__mmask16>(0xFFFF), v);
  const __m512 denominator = _mm512_add_ps(
      _mm512_mul_ps(root, _mm512_set1_ps(c.inv_sqrt_bias_correction2)), _mm512_set1_ps(c.eps));
  p = _mm512_sub_ps(_mm512_mul_ps(p, _mm512_set1_ps(c.decay_factor)),
                    _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(c.step_size), m), denominator));
}

#endif  // __x86_64__

#if defined(__aarch64__)

// Four elements in NEON lanes. AArch64's FSQRT and FDIV on vectors are correctly rounded; the
// estimates (vrsqrteq_f32, vrecpeq_f32) would not be. vmulq_f32 followed by vaddq_f32 stays two
// roundings because the including files are compiled with -ffp-contract=off (GCC would otherwise
// emit FMLA).
inline void adamw4(float32x4_t& p, float32x4_t grad, float32x4_t& m, float32x4_t& v,
                   const AdamWConstants& c) {
  const float32x4_t g = vmulq_f32(grad, vdupq_n_f32(c.grad_scale));
  m = vaddq_f32(vmulq_f32(vdupq_n_f32(c.beta1), m), vmulq_f32(vdupq_n_f32(c.one_minus_beta1), g));
  v = vaddq_f32(vmulq_f32(vdupq_n_f32(c.beta2), v),
                vmulq_f32(vmulq_f32(vdupq_n_f32(c.one_minus_beta2), g), g));
  const float32x4_t denominator = vaddq_f32(
      vmulq_f32(vsqrtq_f32(v), vdupq_n_f32(c.inv_sqrt_bias_correction2)), vdupq_n_f32(c.eps));
  p = vsubq_f32(vmulq_f32(p, vdupq_n_f32(c.decay_factor)),
                vdivq_f32(vmulq_f32(vdupq_n_f32(c.step_size), m), denominator));
}

#endif  // __aarch64__

}  // namespace layup
