// A small deterministic random-number generator whose whole state is one 64-bit word.
//
// One word of state makes it trivial to save in a checkpoint and to restore bit-exactly, which
// the resume guarantee (straight run == interrupted + resumed run) depends on. The sequence is
// SplitMix64 (Steele, Lea, Flood 2014): good enough for weight init and batch sampling, and the
// same on every platform, unlike std::normal_distribution.
#pragma once

#include <cmath>
#include <cstdint>

namespace layup {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, 1) with 24 bits of precision, so the result is exactly representable.
  float uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

  // Uniform integer in [0, bound). The modulo bias is below 2^-40 for the bounds used here.
  uint64_t below(uint64_t bound) { return next_u64() % bound; }

  // Standard normal by Box-Muller, computed in double so every platform agrees.
  float normal() {
    double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;          // [0, 1)
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }

  uint64_t state() const { return state_; }
  void set_state(uint64_t state) { state_ = state; }

 private:
  uint64_t state_;
};

}  // namespace layup
