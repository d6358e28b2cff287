// AdamW's two moments in the run's optimizer state kind (core/run_choices.h): where they lie
// (AdamWMoments) and how a moment is encoded and decoded in each kind. The AdamW loops over them
// are in optim/adamw_state.h; docs/optimizer_state.md says what each kind is, what it costs and
// what it changes numerically.
//
//   fp32  the values.
//   bf16  each value rounded to bfloat16, to nearest even (the upper 16 bits of the fp32 value
//         after adding 0x7FFF plus the lowest kept bit; a NaN becomes 0x7FFF); decoding appends 16
//         zero bits.
//   8bit  blockwise dynamic quantisation (Dettmers et al. 2022, "8-bit Optimizers via Block-wise
//         Quantization", as bitsandbytes and torchao implement it): each block of
//         kOptimizerStateBlock consecutive values keeps its largest magnitude as an fp32 scale and
//         each value as the one-byte code of the nearest entry of a fixed 256-entry map of
//         [-1, 1] (m) or (0, 1] (v) to value / scale. Decoding is map[code] * scale. v's map has
//         no 0 (Li et al. 2023, "Memory Efficient Optimizers with 4-bit States": a second moment
//         decoded as 0 under a first moment that is not blows the next step up).
//
// The 8-bit code of y (value / scale, or the value itself where the scale is 0) is exactly the
// number of the map's thresholds below y, where threshold k is the largest float not above the
// midpoint of entries k and k + 1: the nearest entry, ties to the lower one, and code 0 for a NaN.
// Every loop, SIMD level and device computes that same integer, so they agree bit for bit.
//
// All-zero bytes are the zero state in every kind (an 8-bit block whose scale is 0 decodes to 0
// whatever its codes), so zeroed memory is a fresh optimizer.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/run_choices.h"

namespace layup {

// Where the moments of a run of consecutive elements (a span, or a rank's part of one) lie. The
// pointers address the run's first element (its first block for 8bit) and may point anywhere;
// in_buffer lays them out in one buffer of optimizer_moments_bytes(kind, count) bytes.
struct AdamWMoments {
  OptimizerStateKind kind = OptimizerStateKind::kFp32;
  void* m = nullptr;  // fp32: float; bf16: uint16_t bfloat16 bits; 8bit: uint8_t codes
  void* v = nullptr;
  float* m_scales = nullptr;  // 8bit: one per block of kOptimizerStateBlock values; else null
  float* v_scales = nullptr;

  static AdamWMoments fp32(float* m, float* v) {
    return {OptimizerStateKind::kFp32, m, v, nullptr, nullptr};
  }
  static AdamWMoments bf16(uint16_t* m, uint16_t* v) {
    return {OptimizerStateKind::kBf16, m, v, nullptr, nullptr};
  }
  static AdamWMoments blockwise_8bit(uint8_t* m, uint8_t* v, float* m_scales, float* v_scales) {
    return {OptimizerStateKind::kBlockwise8Bit, m, v, m_scales, v_scales};
  }
  // The moments of `count` elements in one buffer (at least 4-byte aligned): m then v, each
  // `count` values of the kind; for 8bit first m's then v's optimizer_state_blocks(count) scales,
  // then m's and v's codes.
  static AdamWMoments in_buffer(OptimizerStateKind kind, void* buffer, size_t count);

  // The same moments from element `offset` on, which must start a block in 8bit (throws
  // layup::Error otherwise).
  AdamWMoments at(size_t offset) const;

  float* m_fp32() const { return static_cast<float*>(m); }
  float* v_fp32() const { return static_cast<float*>(v); }
  uint16_t* m_bf16() const { return static_cast<uint16_t*>(m); }
  uint16_t* v_bf16() const { return static_cast<uint16_t*>(v); }
  uint8_t* m_codes() const { return static_cast<uint8_t*>(m); }
  uint8_t* v_codes() const { return static_cast<uint8_t*>(v); }
};

// ---- bf16 ------------------------------------------------------------------------------------

inline uint16_t bf16_from_float(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (x != x) return 0x7FFF;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float float_from_bf16(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// ---- 8bit ------------------------------------------------------------------------------------

// One moment's dynamic map, with what finding a code quickly needs.
//
// The lookup: a float's magnitude, clamped to [2^-23, 1], and its sign choose a bucket of floats
// that share their upper 16 bits (lookup_index; no threshold lies below 2^-23 or above 1). No
// bucket holds more than one threshold (checked where the map is built), so the code of any y in
// a bucket is the code of its lowest value, plus one where y is above the threshold in it. Within
// a bucket that comparison is one of the lower 16 bits (lookup_key: their order is the values'
// order for positive floats, the reverse for negative ones), so one 32-bit entry holds both.
struct Blockwise8BitMap {
  static constexpr uint32_t kLowestMagnitude = 0x34000000u;   // 2^-23
  static constexpr uint32_t kHighestMagnitude = 0x3F800000u;  // 1
  static constexpr uint32_t kLookupHalf = ((kHighestMagnitude - kLowestMagnitude) >> 16) + 1;
  static constexpr uint32_t kNoSplit = 0xFFFF;  // no key is above it

  float values[256];  // ascending; code c decodes to values[c] * scale
  // thresholds[k], k < 255: the largest float not above (values[k] + values[k + 1]) / 2;
  // thresholds[255] = +infinity, which nothing is above.
  float thresholds[256];
  // Per bucket: the code of its lowest value in the lower 16 bits, and in the upper 16 the key of
  // the threshold in it (kNoSplit where it holds none).
  uint32_t lookup[2 * kLookupHalf];
};

// The signed map for m: 127 negative entries, 0, and 128 positive ones up to 1; bitsandbytes'
// create_dynamic_map(signed=True) with 7 exponent bits: in decade d = 0..6 the midpoints of 2^d
// equal steps of [0.1, 1], times 10^(d-6), and their negatives. The unsigned map for v: its
// create_dynamic_map(signed=False), 2^(d+1) midpoints a decade, with 0 replaced by 0.55e-7 (the
// one midpoint of a decade below). Computed in double and rounded to float once.
const Blockwise8BitMap& signed_moment_map();
const Blockwise8BitMap& unsigned_moment_map();

inline uint32_t lookup_index(float y) {
  const uint32_t bits = std::bit_cast<uint32_t>(y);
  const uint32_t magnitude = std::clamp(bits & 0x7FFFFFFFu, Blockwise8BitMap::kLowestMagnitude,
                                        Blockwise8BitMap::kHighestMagnitude);
  return ((magnitude - Blockwise8BitMap::kLowestMagnitude) >> 16) +
         ((bits >> 31) != 0 ? Blockwise8BitMap::kLookupHalf : 0u);
}

// y's place within its bucket, in the values' order.
inline uint32_t lookup_key(float y) {
  const uint32_t bits = std::bit_cast<uint32_t>(y);
  return (bits & 0xFFFFu) ^ ((bits >> 31) != 0 ? 0xFFFFu : 0u);
}

// The code of y: the number of the map's thresholds below y (see the top of this file).
inline uint8_t blockwise_8bit_code(const Blockwise8BitMap& map, float y) {
  const uint32_t entry = map.lookup[lookup_index(y)];
  const uint32_t code = (entry & 0xFFFFu) + (lookup_key(y) > (entry >> 16) ? 1u : 0u);
  return y == y ? static_cast<uint8_t>(code) : 0;
}

// The same count by binary search over the thresholds, without the lookup: how the lookup is
// built, and a second definition for tests.
uint8_t blockwise_8bit_code_by_search(const Blockwise8BitMap& map, float y);

// What a block's values are divided by before they are coded: the scale, or 1 where the scale is
// 0 (every value of such a block is zero).
inline float blockwise_8bit_divisor(float scale) {
  return scale > 0.0f ? scale : 1.0f;
}

// The largest |x| of a block, a NaN counting as nothing (so max(|x|, largest), in that order, at
// every SIMD width, where a NaN operand yields the second).
inline float blockwise_8bit_scale(const float* x, size_t count) {
  float largest = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    const float magnitude = std::bit_cast<float>(std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
    largest = magnitude > largest ? magnitude : largest;
  }
  return largest;
}

// The worst error of decoding a coded value, as a fraction of its block's scale: half the widest
// gap between neighbouring entries, or the gap below the lowest entry (to -1 for m, to 0 for v;
// 1 is an entry of both maps). For the signed map 0.0070 (the gaps of 0.9/64 in the top decade),
// for the unsigned one 0.0035 (0.9/128). Relative precision falls with magnitude: the decade
// 10^-k of the scale has 2^(6-k) entries for m (twice as many for v), so an m below 2.75e-7 of
// the scale becomes 0 and a v below 1.9e-7 of it becomes 0.55e-7 of it.
double blockwise_8bit_error_bound(const Blockwise8BitMap& map);

// ---- whole runs (scalar: conversions, checkpoints, tests) -------------------------------------

// The moments of `count` elements from fp32 values into `out`'s kind (8bit: blocks from the first
// element, the last one short), and back; decoding skips a null output.
void encode_moments(const float* m, const float* v, size_t count, const AdamWMoments& out);
void decode_moments(const AdamWMoments& in, size_t count, float* m, float* v);
// The coded moments of `count` elements from `from` to `to` (both of one kind, in host memory),
// bit for bit: the values (8bit: codes) and the block scales.
void copy_moments(const AdamWMoments& from, const AdamWMoments& to, size_t count);

// The arrays that hold `count` elements' moments in `moments`, each as its first byte and its
// size: m's and v's values (8bit: codes), then (8bit) m's and v's block scales. The same list, in
// the same order, for any two AdamWMoments of one kind, so moments copy array by array (between
// memories too: a staging slot on the device).
struct MomentArray {
  void* data;
  size_t bytes;
};
std::vector<MomentArray> moment_arrays(const AdamWMoments& moments, size_t count);

}  // namespace layup
