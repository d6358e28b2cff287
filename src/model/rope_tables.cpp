// Rotary frequencies and their cos/sin tables; see rope_tables.h.
//
// Llama 3 scaling (rope_type "llama3"): with wavelength w_i = 2 pi / inv_freq_i, L the original
// context length, w_low = L / low_freq_factor and w_high = L / high_freq_factor (w_high < w_low):
//
//   w_i < w_high:           inv_freq_i                        (fast rotations: kept)
//   w_i > w_low:            inv_freq_i / factor               (slow rotations: stretched)
//   otherwise:              (1 - s) inv_freq_i / factor + s inv_freq_i,
//                           s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
//
// s runs from 0 at w_low to 1 at w_high, so the blend joins both sides continuously.
#include "model/rope_tables.h"

#include <cmath>
#include <cstddef>
#include <numbers>

#include "core/error.h"

namespace layup {

void rope_inverse_frequencies(float* inv_freq, int head_dim, float theta,
                              const RopeScaling& scaling) {
  const RopeScaling* llama3 = scaling.llama3 ? &scaling : nullptr;
  LAYUP_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary embeddings need an even head_dim, not ",
              head_dim);
  LAYUP_CHECK(theta > 1.0f, "rope_theta must be > 1, not ", theta);
  if (llama3) {
    LAYUP_CHECK(llama3->factor > 0.0f && llama3->original_max_position_embeddings > 0 &&
                    llama3->low_freq_factor > 0.0f &&
                    llama3->high_freq_factor > llama3->low_freq_factor,
                "llama3 rope_scaling needs factor > 0, original_max_position_embeddings > 0 and "
                "high_freq_factor > low_freq_factor > 0; got factor ",
                llama3->factor, ", original_max_position_embeddings ",
                llama3->original_max_position_embeddings, ", low_freq_factor ",
                llama3->low_freq_factor, ", high_freq_factor ", llama3->high_freq_factor);
  }
  for (int i = 0; i < head_dim / 2; ++i) {
    // The float steps of transformers (and Meta's reference): the exponent 2i/D, the power and
    // the reciprocal each rounded to float. A frequency one ulp off turns the fastest pairs by
    // t * 6e-8 rad more at position t, visible at t in the thousands; these steps give
    // transformers' bits for nearly every i (its float pow is not always correctly rounded).
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power =
        static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(exponent)));
    double frequency = 1.0f / power;
    // The Llama 3 rescaling may run in double: it moves only slow pairs (wavelength >= w_high),
    // whose ulp is small enough not to matter at any position.
    if (llama3) {
      const double context = llama3->original_max_position_embeddings;
      const double wavelength = 2.0 * std::numbers::pi / frequency;
      const double low_freq_wavelength = context / llama3->low_freq_factor;
      const double high_freq_wavelength = context / llama3->high_freq_factor;
      if (wavelength > low_freq_wavelength) {
        frequency /= llama3->factor;
      } else if (wavelength >= high_freq_wavelength) {
        const double smooth = (context / wavelength - llama3->low_freq_factor) /
                              (llama3->high_freq_factor - llama3->low_freq_factor);
        frequency = (1.0 - smooth) * frequency / llama3->factor + smooth * frequency;
      }
    }
    inv_freq[i] = static_cast<float>(frequency);
  }
}

void rope_cos_sin(float* cos, float* sin, const float* inv_freq, int T, int head_dim) {
  const int half = head_dim / 2;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      // The float product, as transformers forms it: at t in the thousands its rounding moves
      // the angle by more than cos/sin's own error, so matching it matters more.
      const float angle = static_cast<float>(t) * inv_freq[i];
      cos[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(double{angle}));
      sin[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(double{angle}));
    }
  }
}

}  // namespace layup
