// The optimizer state kinds' storage and codecs: the 8-bit maps as stated, the code as the nearest
// entry (against a plain search in double), the round trip within the maps' stated error, bf16's
// rounding, the one-buffer layout and its bytes, and zeroed memory as the zero state.
#include "optim/adamw_moments.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace layup {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The index of the map entry nearest y, the lower one on a tie, 0 for a NaN: the definition the
// lookup must meet, by a plain search in double (both floats, so each difference is exact where a
// tie could matter).
uint8_t nearest_code(const Blockwise8BitMap& map, float y) {
  if (std::isnan(y)) return 0;
  // Beyond [-2, 2] the nearest entry is an end, and the distances would round alike in double.
  y = std::clamp(y, -2.0f, 2.0f);
  int best = 0;
  double best_distance = std::fabs(static_cast<double>(y) - map.values[0]);
  for (int k = 1; k < 256; ++k) {
    const double distance = std::fabs(static_cast<double>(y) - map.values[k]);
    if (distance < best_distance) {
      best = k;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

// Values a code must get right: the entries, the thresholds and the floats beside them, the
// signs' edges and the IEEE corners, then random ones of every magnitude in [-1, 1].
std::vector<float> probe_values(const Blockwise8BitMap& map) {
  std::vector<float> probes = {0.0f,  -0.0f,  1.0f,    -1.0f,  kInf, -kInf, kNaN,
                               -kNaN, 1e-45f, -1e-45f, 1e-38f, 2.0f, -2.0f, 1e30f};
  for (int k = 0; k < 256; ++k) {
    for (float x : {map.values[k], map.thresholds[k]}) {
      if (std::isinf(x)) continue;
      probes.push_back(x);
      probes.push_back(std::nextafter(x, kInf));
      probes.push_back(std::nextafter(x, -kInf));
    }
  }
  Rng rng(7);
  for (int i = 0; i < 20000; ++i) {
    const float magnitude = std::pow(10.0f, -9.0f * rng.uniform());
    probes.push_back(rng.uniform() < 0.5f ? magnitude : -magnitude);
  }
  return probes;
}

void expect_map_as_stated(const Blockwise8BitMap& map, bool is_signed) {
  for (int k = 0; k + 1 < 256; ++k) {
    ASSERT_LT(map.values[k], map.values[k + 1]) << k;
    // The largest float not above the midpoint.
    const double midpoint = (static_cast<double>(map.values[k]) + map.values[k + 1]) / 2.0;
    EXPECT_LE(static_cast<double>(map.thresholds[k]), midpoint) << k;
    EXPECT_GT(static_cast<double>(std::nextafter(map.thresholds[k], kInf)), midpoint) << k;
  }
  EXPECT_EQ(map.thresholds[255], kInf);
  EXPECT_EQ(map.values[255], 1.0f);
  if (is_signed) {
    EXPECT_EQ(map.values[127], 0.0f);
    EXPECT_FLOAT_EQ(map.values[0], -(0.1f + 0.9f * 63.5f / 64.0f));  // the top decade's last
    EXPECT_FLOAT_EQ(map.values[128], 0.55e-6f);  // decade 0: one midpoint, of [0.1, 1] x 1e-6
  } else {
    EXPECT_FLOAT_EQ(map.values[0], 0.55e-7f);   // no 0: a decade further down instead
    EXPECT_FLOAT_EQ(map.values[1], 0.325e-6f);  // decade 0: two midpoints
    EXPECT_FLOAT_EQ(map.values[254], 0.1f + 0.9f * 127.5f / 128.0f);
  }
}

TEST(AdamWMoments, TheMapsAreBitsandbytesDynamicMapsWithThresholdsBelowTheMidpoints) {
  expect_map_as_stated(signed_moment_map(), true);
  expect_map_as_stated(unsigned_moment_map(), false);
}

TEST(AdamWMoments, TheCodeIsTheNearestEntryTiesToTheLower) {
  for (const Blockwise8BitMap* map : {&signed_moment_map(), &unsigned_moment_map()}) {
    for (float y : probe_values(*map)) {
      const uint8_t expected = nearest_code(*map, y);
      ASSERT_EQ(blockwise_8bit_code(*map, y), expected) << "y = " << y;
      ASSERT_EQ(blockwise_8bit_code_by_search(*map, y), expected) << "y = " << y;
    }
  }
}

// The lookup against the search over a sweep of bit patterns through every bucket of [-1, 1].
TEST(AdamWMoments, TheLookupAgreesWithTheSearchAcrossEveryBucket) {
  for (const Blockwise8BitMap* map : {&signed_moment_map(), &unsigned_moment_map()}) {
    for (uint32_t bits = 0; bits <= 0x3F800000u; bits += 997) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const float y = std::bit_cast<float>(bits | sign);
        ASSERT_EQ(blockwise_8bit_code(*map, y), blockwise_8bit_code_by_search(*map, y))
            << "bits " << std::hex << (bits | sign);
      }
    }
  }
}

TEST(AdamWMoments, TheErrorBoundsAreHalfTheTopDecadesSteps) {
  EXPECT_NEAR(blockwise_8bit_error_bound(signed_moment_map()), 0.9 / 64 / 2, 1e-7);
  EXPECT_NEAR(blockwise_8bit_error_bound(unsigned_moment_map()), 0.9 / 128 / 2, 1e-7);
}

// Blocks of very different magnitudes, a block of zeros and a short last block, coded and decoded:
// each value within bound x its block's scale (plus the two roundings of dividing and decoding).
TEST(AdamWMoments, EightBitRoundTripIsWithinTheMapsBound) {
  const size_t count = 5 * kOptimizerStateBlock + 77;
  std::vector<float> m(count), v(count);
  Rng rng(3);
  for (size_t i = 0; i < count; ++i) {
    const size_t block = i / kOptimizerStateBlock;
    const float magnitude = block == 2 ? 0.0f : std::pow(10.0f, -2.0f * block);
    m[i] = magnitude * rng.normal() * std::pow(10.0f, -3.0f * rng.uniform());
    v[i] = m[i] * m[i];
  }
  std::vector<uint8_t> buffer(optimizer_moments_bytes(OptimizerStateKind::kBlockwise8Bit, count));
  const AdamWMoments moments =
      AdamWMoments::in_buffer(OptimizerStateKind::kBlockwise8Bit, buffer.data(), count);
  encode_moments(m.data(), v.data(), count, moments);
  std::vector<float> m_back(count), v_back(count);
  decode_moments(moments, count, m_back.data(), v_back.data());
  const double m_bound = blockwise_8bit_error_bound(signed_moment_map());
  const double v_bound = blockwise_8bit_error_bound(unsigned_moment_map());
  for (size_t i = 0; i < count; ++i) {
    const size_t block = i / kOptimizerStateBlock;
    const double m_scale = moments.m_scales[block], v_scale = moments.v_scales[block];
    ASSERT_LE(std::fabs(m_back[i] - static_cast<double>(m[i])), m_scale * (m_bound + 1e-6)) << i;
    ASSERT_LE(std::fabs(v_back[i] - static_cast<double>(v[i])), v_scale * (v_bound + 1e-6)) << i;
    if (block == 2) {
      ASSERT_EQ(m_back[i], 0.0f) << i;
    }
  }
  // The scales are the blocks' largest magnitudes, and those come back exactly (1 is an entry).
  EXPECT_EQ(moments.m_scales[2], 0.0f);
  for (size_t block = 0; block < optimizer_state_blocks(count); ++block) {
    const size_t first = block * kOptimizerStateBlock;
    const size_t n = std::min(kOptimizerStateBlock, count - first);
    float largest = 0.0f;
    for (size_t i = first; i < first + n; ++i) largest = std::max(largest, std::fabs(v[i]));
    EXPECT_EQ(moments.v_scales[block], largest) << block;
  }
}

TEST(AdamWMoments, TheScaleIgnoresNaNs) {
  const float x[] = {0.5f, kNaN, -2.0f, -kNaN, 1.0f};
  EXPECT_EQ(blockwise_8bit_scale(x, 5), 2.0f);
  EXPECT_EQ(blockwise_8bit_scale(x + 1, 1), 0.0f);
}

// bf16: to nearest, ties to even, overflow to infinity, any NaN to 0x7FFF.
TEST(AdamWMoments, Bf16RoundsToNearestEven) {
  const auto bits = [](uint32_t pattern) { return bf16_from_float(std::bit_cast<float>(pattern)); };
  EXPECT_EQ(bits(0x3F800000u), 0x3F80);
  EXPECT_EQ(bits(0x3F807FFFu), 0x3F80);  // below half
  EXPECT_EQ(bits(0x3F808000u), 0x3F80);  // a tie, to the even 0x3F80
  EXPECT_EQ(bits(0x3F818000u), 0x3F82);  // a tie, to the even 0x3F82
  EXPECT_EQ(bits(0x3F808001u), 0x3F81);  // above half
  EXPECT_EQ(bits(0xBF808001u), 0xBF81);
  EXPECT_EQ(bits(0x7F7FFFFFu), 0x7F80);  // the largest float rounds to infinity
  EXPECT_EQ(bits(0x7F800000u), 0x7F80);
  EXPECT_EQ(bits(0xFF800000u), 0xFF80);
  EXPECT_EQ(bits(0x7FC00001u), 0x7FFF);
  EXPECT_EQ(bits(0xFFFFFFFFu), 0x7FFF);
  EXPECT_EQ(bits(0x00000001u), 0x0000);  // the smallest subnormal rounds to zero
  EXPECT_EQ(float_from_bf16(0x3F81), std::bit_cast<float>(0x3F810000u));
}

TEST(AdamWMoments, OneBufferHoldsTheMomentsInTheirBytes) {
  EXPECT_EQ(optimizer_moments_bytes(OptimizerStateKind::kFp32, 1000), 8000u);
  EXPECT_EQ(optimizer_moments_bytes(OptimizerStateKind::kBf16, 1000), 4000u);
  EXPECT_EQ(optimizer_moments_bytes(OptimizerStateKind::kBlockwise8Bit, 1000), 2000u + 8 * 4);
  EXPECT_EQ(optimizer_moments_bytes(OptimizerStateKind::kBlockwise8Bit, 1024), 2048u + 8 * 4);
  EXPECT_EQ(optimizer_moments_bytes(OptimizerStateKind::kBlockwise8Bit, 0), 0u);

  // Each piece of in_buffer's layout lies inside the buffer and overlaps no other.
  const size_t count = 1000;
  for (auto [kind, name] : kOptimizerStateKindNames) {
    std::vector<uint8_t> buffer(optimizer_moments_bytes(kind, count));
    const AdamWMoments moments = AdamWMoments::in_buffer(kind, buffer.data(), count);
    const size_t width = kind == OptimizerStateKind::kFp32   ? 4
                         : kind == OptimizerStateKind::kBf16 ? 2
                                                             : 1;
    struct Piece {
      const void* at;
      size_t bytes;
    };
    std::vector<Piece> pieces = {{moments.m, count * width}, {moments.v, count * width}};
    if (kind == OptimizerStateKind::kBlockwise8Bit) {
      pieces.push_back({moments.m_scales, optimizer_state_blocks(count) * sizeof(float)});
      pieces.push_back({moments.v_scales, optimizer_state_blocks(count) * sizeof(float)});
    } else {
      EXPECT_EQ(moments.m_scales, nullptr) << name;
    }
    size_t total = 0;
    for (const Piece& piece : pieces) {
      const auto* begin = static_cast<const uint8_t*>(piece.at);
      EXPECT_GE(begin, buffer.data()) << name;
      EXPECT_LE(begin + piece.bytes, buffer.data() + buffer.size()) << name;
      total += piece.bytes;
      for (const Piece& other : pieces) {
        if (&other == &piece) continue;
        const auto* other_begin = static_cast<const uint8_t*>(other.at);
        EXPECT_TRUE(begin + piece.bytes <= other_begin || other_begin + other.bytes <= begin)
            << name;
      }
    }
    EXPECT_EQ(total, buffer.size()) << name;
  }
}

TEST(AdamWMoments, EightBitMomentsSplitOnlyAtBlocks) {
  std::vector<uint8_t> buffer(optimizer_moments_bytes(OptimizerStateKind::kBlockwise8Bit, 1000));
  const AdamWMoments moments =
      AdamWMoments::in_buffer(OptimizerStateKind::kBlockwise8Bit, buffer.data(), 1000);
  const AdamWMoments second = moments.at(kOptimizerStateBlock);
  EXPECT_EQ(second.m_codes(), moments.m_codes() + kOptimizerStateBlock);
  EXPECT_EQ(second.v_scales, moments.v_scales + 1);
  EXPECT_THROW(moments.at(100), Error);
  std::vector<float> fp32(2000);
  EXPECT_EQ(AdamWMoments::fp32(fp32.data(), fp32.data() + 1000).at(100).m_fp32(),
            fp32.data() + 100);
}

// A zeroed buffer is the zero state in every kind: the optimizer a fresh allocation starts from.
TEST(AdamWMoments, ZeroedMemoryDecodesToZero) {
  const size_t count = 600;
  for (auto [kind, name] : kOptimizerStateKindNames) {
    std::vector<uint8_t> buffer(optimizer_moments_bytes(kind, count), 0);
    std::vector<float> m(count, 1.0f), v(count, 1.0f);
    decode_moments(AdamWMoments::in_buffer(kind, buffer.data(), count), count, m.data(), v.data());
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(m[i], 0.0f) << name << " " << i;
      ASSERT_EQ(v[i], 0.0f) << name << " " << i;
    }
  }
}

}  // namespace
}  // namespace layup
