// The 8-bit maps and their lookups, built once, and the scalar conversions of whole runs.
#include "optim/adamw_moments.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

namespace layup {

namespace {

constexpr size_t kBlock = kOptimizerStateBlock;

// The entries of create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): decade d spans
// [0.1, 1] x 10^(d-6) in `items` equal steps and contributes their midpoints (and their negatives
// in the signed map); then 1, and 0 in the signed map. The unsigned map has instead the midpoint
// of one decade further down, 0.55e-7: a second moment coded as 0 where the first is not would
// make the next step m / eps (the zero-point problem, Li et al. 2023), so v never decodes to 0
// unless its whole block is 0. The decades are literals so that no libm result enters.
std::array<float, 256> dynamic_map_values(bool is_signed) {
  constexpr double kDecades[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<double> entries;
  for (int d = 0; d < 7; ++d) {
    const int items = is_signed ? 1 << d : 2 << d;
    for (int j = 0; j < items; ++j) {
      const double low = 0.1 + 0.9 * j / items, high = 0.1 + 0.9 * (j + 1) / items;
      const double mean = (low + high) / 2.0;
      entries.push_back(kDecades[d] * mean);
      if (is_signed) entries.push_back(-kDecades[d] * mean);
    }
  }
  entries.push_back(is_signed ? 0.0 : 1e-7 * 0.55);
  entries.push_back(1.0);
  LAYUP_CHECK(entries.size() == 256, "the 8-bit map has ", entries.size(), " entries, not 256");
  std::sort(entries.begin(), entries.end());
  std::array<float, 256> values;
  for (size_t k = 0; k < 256; ++k) values[k] = static_cast<float>(entries[k]);
  return values;
}

// The smallest and the largest float of lookup bucket `index` (lookup_index), in value order:
// the first and last bucket of each sign take every magnitude clamped into them.
void bucket_bounds(uint32_t index, float& lowest, float& highest) {
  const bool negative = index >= Blockwise8BitMap::kLookupHalf;
  const uint32_t bucket = negative ? index - Blockwise8BitMap::kLookupHalf : index;
  const uint32_t first = Blockwise8BitMap::kLowestMagnitude + (bucket << 16);
  const uint32_t smallest = bucket == 0 ? 0u : first;
  const uint32_t largest =
      first == Blockwise8BitMap::kHighestMagnitude ? 0x7F800000u : first | 0xFFFFu;
  const float small = std::bit_cast<float>(smallest), large = std::bit_cast<float>(largest);
  lowest = negative ? -large : small;
  highest = negative ? -small : large;
}

Blockwise8BitMap build_map(bool is_signed) {
  Blockwise8BitMap map{};
  const std::array<float, 256> values = dynamic_map_values(is_signed);
  std::copy(values.begin(), values.end(), map.values);
  for (size_t k = 0; k + 1 < 256; ++k) {
    // Two floats' midpoint is exact in double; round it down to a float.
    const double midpoint = (static_cast<double>(values[k]) + values[k + 1]) / 2.0;
    float threshold = static_cast<float>(midpoint);
    if (static_cast<double>(threshold) > midpoint)
      threshold = std::nextafter(threshold, -std::numeric_limits<float>::infinity());
    map.thresholds[k] = threshold;
  }
  map.thresholds[255] = std::numeric_limits<float>::infinity();
  for (uint32_t index = 0; index < 2 * Blockwise8BitMap::kLookupHalf; ++index) {
    float lowest, highest;
    bucket_bounds(index, lowest, highest);
    const uint8_t low_code = blockwise_8bit_code_by_search(map, lowest);
    const uint8_t high_code = blockwise_8bit_code_by_search(map, highest);
    uint32_t split = Blockwise8BitMap::kNoSplit;
    if (high_code != low_code) {
      // The one threshold in the bucket must share its upper bits, which a clamped magnitude
      // would not: then the key orders it among the bucket's floats.
      const float threshold = map.thresholds[low_code];
      LAYUP_CHECK(high_code == low_code + 1 && lookup_index(threshold) == index &&
                      (std::bit_cast<uint32_t>(threshold) & 0x7FFFFFFFu) >=
                          Blockwise8BitMap::kLowestMagnitude &&
                      (std::bit_cast<uint32_t>(threshold) & 0x7FFFFFFFu) <
                          Blockwise8BitMap::kHighestMagnitude,
                  "8-bit map lookup bucket ", index, " holds ", high_code - low_code,
                  " thresholds, or one in a clamped range; it needs other bounds");
      split = lookup_key(threshold);
    }
    map.lookup[index] = low_code | split << 16;
  }
  return map;
}

}  // namespace

AdamWMoments AdamWMoments::in_buffer(OptimizerStateKind kind, void* buffer, size_t count) {
  auto* bytes = static_cast<uint8_t*>(buffer);
  switch (kind) {
    case OptimizerStateKind::kFp32: {
      auto* m = reinterpret_cast<float*>(bytes);
      return fp32(m, m + count);
    }
    case OptimizerStateKind::kBf16: {
      auto* m = reinterpret_cast<uint16_t*>(bytes);
      return bf16(m, m + count);
    }
    case OptimizerStateKind::kBlockwise8Bit: {
      const size_t blocks = optimizer_state_blocks(count);
      auto* scales = reinterpret_cast<float*>(bytes);
      uint8_t* codes = bytes + 2 * blocks * sizeof(float);
      return blockwise_8bit(codes, codes + count, scales, scales + blocks);
    }
  }
  fail("unknown optimizer state kind");
}

AdamWMoments AdamWMoments::at(size_t offset) const {
  switch (kind) {
    case OptimizerStateKind::kFp32:
      return fp32(m_fp32() + offset, v_fp32() + offset);
    case OptimizerStateKind::kBf16:
      return bf16(m_bf16() + offset, v_bf16() + offset);
    case OptimizerStateKind::kBlockwise8Bit:
      LAYUP_CHECK(offset % kBlock == 0, "8-bit optimizer state can be split only at its blocks of ",
                  kBlock, " values, not at element ", offset);
      return blockwise_8bit(m_codes() + offset, v_codes() + offset, m_scales + offset / kBlock,
                            v_scales + offset / kBlock);
  }
  fail("unknown optimizer state kind");
}

const Blockwise8BitMap& signed_moment_map() {
  static const Blockwise8BitMap map = build_map(true);
  return map;
}

const Blockwise8BitMap& unsigned_moment_map() {
  static const Blockwise8BitMap map = build_map(false);
  return map;
}

uint8_t blockwise_8bit_code_by_search(const Blockwise8BitMap& map, float y) {
  // The thresholds ascend and "below y" holds for a prefix of them (for none where y is NaN):
  // find the prefix's length by halving. thresholds[255] is never below y, so it ends at 255.
  uint32_t code = 0;
  for (uint32_t step = 128; step > 0; step /= 2)
    if (map.thresholds[code + step - 1] < y) code += step;
  return static_cast<uint8_t>(code);
}

double blockwise_8bit_error_bound(const Blockwise8BitMap& map) {
  // The lowest value a block can hold (-scale for m, 0 for v) coded as the lowest entry.
  const double lowest = map.values[0] < 0.0f ? -1.0 : 0.0;
  double bound = map.values[0] - lowest;
  for (size_t k = 0; k + 1 < 256; ++k)
    bound = std::max(bound, (static_cast<double>(map.values[k + 1]) - map.values[k]) / 2.0);
  return bound;
}

void encode_moments(const float* m, const float* v, size_t count, const AdamWMoments& out) {
  // Over the cores: a fresh 8B model's moments are coded once at start-up, 16 G values. Each
  // block (8bit) or element is coded alone, so the bits do not depend on the thread count.
  const auto blocks = static_cast<std::ptrdiff_t>((count + kBlock - 1) / kBlock);
  switch (out.kind) {
    case OptimizerStateKind::kFp32:
      std::copy(m, m + count, out.m_fp32());
      std::copy(v, v + count, out.v_fp32());
      return;
    case OptimizerStateKind::kBf16:
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < static_cast<std::ptrdiff_t>(count); ++i) {
        out.m_bf16()[i] = bf16_from_float(m[i]);
        out.v_bf16()[i] = bf16_from_float(v[i]);
      }
      return;
    case OptimizerStateKind::kBlockwise8Bit: {
      const Blockwise8BitMap& m_map = signed_moment_map();
      const Blockwise8BitMap& v_map = unsigned_moment_map();
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t block = 0; block < blocks; ++block) {
        const size_t first = static_cast<size_t>(block) * kBlock;
        const size_t n = std::min(kBlock, count - first);
        const float m_scale = blockwise_8bit_scale(m + first, n);
        const float v_scale = blockwise_8bit_scale(v + first, n);
        out.m_scales[block] = m_scale;
        out.v_scales[block] = v_scale;
        const float m_divisor = blockwise_8bit_divisor(m_scale);
        const float v_divisor = blockwise_8bit_divisor(v_scale);
        for (size_t i = first; i < first + n; ++i) {
          out.m_codes()[i] = blockwise_8bit_code(m_map, m[i] / m_divisor);
          out.v_codes()[i] = blockwise_8bit_code(v_map, v[i] / v_divisor);
        }
      }
      return;
    }
  }
}

void copy_moments(const AdamWMoments& from, const AdamWMoments& to, size_t count) {
  LAYUP_CHECK(from.kind == to.kind, "internal error: ", name_of(from.kind), " moments copied into ",
              name_of(to.kind), " ones");
  const std::vector<MomentArray> in = moment_arrays(from, count), out = moment_arrays(to, count);
  // (An empty part's arrays may be null, which memmove may not be given even for 0 bytes.)
  for (size_t a = 0; a < in.size(); ++a)
    if (in[a].bytes > 0) std::memmove(out[a].data, in[a].data, in[a].bytes);
}

std::vector<MomentArray> moment_arrays(const AdamWMoments& moments, size_t count) {
  const size_t element = moments.kind == OptimizerStateKind::kFp32   ? sizeof(float)
                         : moments.kind == OptimizerStateKind::kBf16 ? sizeof(uint16_t)
                                                                     : sizeof(uint8_t);
  std::vector<MomentArray> arrays = {{moments.m, count * element}, {moments.v, count * element}};
  if (moments.kind == OptimizerStateKind::kBlockwise8Bit) {
    const size_t scales = optimizer_state_blocks(count) * sizeof(float);
    arrays.push_back({moments.m_scales, scales});
    arrays.push_back({moments.v_scales, scales});
  }
  return arrays;
}

void decode_moments(const AdamWMoments& in, size_t count, float* m, float* v) {
  const auto n = static_cast<std::ptrdiff_t>(count);
  switch (in.kind) {
    case OptimizerStateKind::kFp32:
      if (m != nullptr) std::copy(in.m_fp32(), in.m_fp32() + count, m);
      if (v != nullptr) std::copy(in.v_fp32(), in.v_fp32() + count, v);
      return;
    case OptimizerStateKind::kBf16:
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < n; ++i) {
        if (m != nullptr) m[i] = float_from_bf16(in.m_bf16()[i]);
        if (v != nullptr) v[i] = float_from_bf16(in.v_bf16()[i]);
      }
      return;
    case OptimizerStateKind::kBlockwise8Bit: {
      const Blockwise8BitMap& m_map = signed_moment_map();
      const Blockwise8BitMap& v_map = unsigned_moment_map();
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < n; ++i) {
        const size_t block = static_cast<size_t>(i) / kBlock;
        if (m != nullptr) m[i] = m_map.values[in.m_codes()[i]] * in.m_scales[block];
        if (v != nullptr) v[i] = v_map.values[in.v_codes()[i]] * in.v_scales[block];
      }
      return;
    }
  }
}

}  // namespace layup
