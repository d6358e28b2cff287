// The bf16 and 8-bit AdamW loops (scalar, AVX2, AVX-512), their shares and the span updates.
//
// Compiled with -ffp-contract=off (CMakeLists.txt), as adamw_simd.cpp is and for the same reason:
// every product and sum rounds on its own at every level. The gathers read the maps' entries,
// which the scalar loop indexes; integer work (codes, bf16 rounding) is the same arithmetic in
// every lane, and the scale is a maximum: no level can round differently.
#include "optim/adamw_state.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/error.h"
#include "optim/adamw_lanes.h"

namespace layup {

namespace {

constexpr size_t kBlock = kOptimizerStateBlock;
// Below this many elements waking the OpenMP team costs more than the loop (as in adamw.cpp).
constexpr size_t kMinParallelCount = size_t{1} << 15;

// Walks a run's DecayRuns along ranges that ascend from call to call.
class DecayCursor {
 public:
  DecayCursor(std::span<const DecayRun> runs, const AdamWConstants& c)
      : runs_(runs), decaying_(c), steady_(c) {
    steady_.decay_factor = 1.0f;
  }
  // Calls body(lo, hi, constants) for each piece of [begin, end) whose elements decay alike, with
  // the constants of that piece's decay. The runs cover [0, end) (the callers check it).
  template <class Body>
  void for_each(size_t begin, size_t end, Body body) {
    while (next_ < runs_.size() && runs_[next_].end <= begin) ++next_;
    for (size_t at = begin, r = next_; at < end && r < runs_.size(); ++r) {
      const size_t stop = std::min(end, runs_[r].end);
      body(at, stop, runs_[r].decay ? decaying_ : steady_);
      at = stop;
    }
  }

 private:
  std::span<const DecayRun> runs_;
  size_t next_ = 0;
  AdamWConstants decaying_, steady_;
};

// ---- bf16 ------------------------------------------------------------------------------------

inline void bf16_element(const AdamWStateBuffers& b, size_t i, const AdamWConstants& c) {
  float p = b.params[i];
  float m = float_from_bf16(b.moments.m_bf16()[i]), v = float_from_bf16(b.moments.v_bf16()[i]);
  adamw_lane(p, b.grads[i], m, v, c);
  b.params_out[i] = p;
  b.moments_out.m_bf16()[i] = bf16_from_float(m);
  b.moments_out.v_bf16()[i] = bf16_from_float(v);
}

// The bf16 driver: each piece of [begin, end) that decays alike through Level::update. (The
// levels' loops are functions of their own: a lambda would not inherit their target attribute.)
template <class Level>
void adamw_bf16(const AdamWStateBuffers& b, size_t begin, size_t end, const AdamWConstants& c,
                std::span<const DecayRun> decay) {
  DecayCursor(decay, c).for_each(begin, end, [&](size_t lo, size_t hi, const AdamWConstants& k) {
    Level::update(b, lo, hi, k);
  });
}

struct ScalarBf16 {
  static void update(const AdamWStateBuffers& b, size_t lo, size_t hi, const AdamWConstants& c) {
    for (size_t i = lo; i < hi; ++i) bf16_element(b, i, c);
  }
};

void adamw_bf16_scalar(const AdamWStateBuffers& b, size_t begin, size_t end,
                       const AdamWConstants& c, std::span<const DecayRun> decay) {
  adamw_bf16<ScalarBf16>(b, begin, end, c, decay);
}

// ---- 8bit ------------------------------------------------------------------------------------

// One block's new fp32 moments, between its update and its coding.
struct BlockMoments {
  alignas(64) float m[kBlock];
  alignas(64) float v[kBlock];
};

// Element i of the block starting at `first`: decoded, updated, its weight written and its new
// moments kept in `block`.
inline void blockwise_8bit_element(const AdamWStateBuffers& b, size_t i, size_t first,
                                   const Blockwise8BitMap& m_map, const Blockwise8BitMap& v_map,
                                   float m_scale, float v_scale, const AdamWConstants& c,
                                   BlockMoments& block) {
  float p = b.params[i];
  float m = m_map.values[b.moments.m_codes()[i]] * m_scale;
  float v = v_map.values[b.moments.v_codes()[i]] * v_scale;
  adamw_lane(p, b.grads[i], m, v, c);
  b.params_out[i] = p;
  block.m[i - first] = m;
  block.v[i - first] = v;
}

inline void encode_scalar(const Blockwise8BitMap& map, const float* x, size_t begin, size_t end,
                          float divisor, uint8_t* codes) {
  for (size_t i = begin; i < end; ++i) codes[i] = blockwise_8bit_code(map, x[i] / divisor);
}

// What the 8-bit driver asks of a level: update a piece of a block, take a block's scale, code a
// block. The scalar level does each element by itself.
struct Scalar8 {
  static void update(const AdamWStateBuffers& b, size_t lo, size_t hi, size_t first,
                     const Blockwise8BitMap& m_map, const Blockwise8BitMap& v_map, float m_scale,
                     float v_scale, const AdamWConstants& c, BlockMoments& block) {
    for (size_t i = lo; i < hi; ++i)
      blockwise_8bit_element(b, i, first, m_map, v_map, m_scale, v_scale, c, block);
  }
  static float scale(const float* x, size_t n) { return blockwise_8bit_scale(x, n); }
  static void encode(const Blockwise8BitMap& map, const float* x, size_t n, float divisor,
                     uint8_t* codes) {
    encode_scalar(map, x, 0, n, divisor, codes);
  }
};

// Blocks [begin, end) one at a time: every element, then the new scales, then the codes. In place
// the block's old codes and scales are all read before the first is written.
template <class Level>
void adamw_8bit(const AdamWStateBuffers& b, size_t begin, size_t end, const AdamWConstants& c,
                std::span<const DecayRun> decay) {
  const Blockwise8BitMap& m_map = signed_moment_map();
  const Blockwise8BitMap& v_map = unsigned_moment_map();
  DecayCursor cursor(decay, c);
  BlockMoments block;
  for (size_t first = begin; first < end; first += kBlock) {
    const size_t n = std::min(kBlock, end - first), index = first / kBlock;
    const float m_scale = b.moments.m_scales[index], v_scale = b.moments.v_scales[index];
    cursor.for_each(first, first + n, [&](size_t lo, size_t hi, const AdamWConstants& k) {
      Level::update(b, lo, hi, first, m_map, v_map, m_scale, v_scale, k, block);
    });
    const float m_new_scale = Level::scale(block.m, n), v_new_scale = Level::scale(block.v, n);
    b.moments_out.m_scales[index] = m_new_scale;
    b.moments_out.v_scales[index] = v_new_scale;
    Level::encode(m_map, block.m, n, blockwise_8bit_divisor(m_new_scale),
                  b.moments_out.m_codes() + first);
    Level::encode(v_map, block.v, n, blockwise_8bit_divisor(v_new_scale),
                  b.moments_out.v_codes() + first);
  }
}

void adamw_8bit_scalar(const AdamWStateBuffers& b, size_t begin, size_t end,
                       const AdamWConstants& c, std::span<const DecayRun> decay) {
  adamw_8bit<Scalar8>(b, begin, end, c, decay);
}

#if defined(__x86_64__)

// ---- AVX2 ------------------------------------------------------------------------------------

__attribute__((target("avx2"))) inline __m256 load_bf16x8(const uint16_t* bits) {
  const __m256i wide =
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// bf16_from_float in each lane.
__attribute__((target("avx2"))) inline void store_bf16x8(uint16_t* out, __m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lowest_kept), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FFF), nan);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
}

struct Avx2Bf16 {
  __attribute__((target("avx2"))) static void update(const AdamWStateBuffers& b, size_t lo,
                                                     size_t hi, const AdamWConstants& c) {
    size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
      __m256 p = _mm256_loadu_ps(b.params + i);
      __m256 m = load_bf16x8(b.moments.m_bf16() + i), v = load_bf16x8(b.moments.v_bf16() + i);
      adamw8(p, _mm256_loadu_ps(b.grads + i), m, v, c);
      _mm256_storeu_ps(b.params_out + i, p);
      store_bf16x8(b.moments_out.m_bf16() + i, m);
      store_bf16x8(b.moments_out.v_bf16() + i, v);
    }
    for (; i < hi; ++i) bf16_element(b, i, c);
  }
};

void adamw_bf16_avx2(const AdamWStateBuffers& b, size_t begin, size_t end, const AdamWConstants& c,
                     std::span<const DecayRun> decay) {
  adamw_bf16<Avx2Bf16>(b, begin, end, c, decay);
}

// map.values[code] * scale for eight codes.
__attribute__((target("avx2"))) inline __m256 decode8(const Blockwise8BitMap& map,
                                                      const uint8_t* codes, __m256 scale) {
  const __m256i index =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_mul_ps(_mm256_i32gather_ps(map.values, index, 4), scale);
}

// blockwise_8bit_code in each lane, as 32-bit integers.
__attribute__((target("avx2"))) inline __m256i code8(const Blockwise8BitMap& map, __m256 y) {
  const __m256i bits = _mm256_castps_si256(y);
  const __m256i magnitude =
      _mm256_min_epu32(_mm256_max_epu32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)),
                                        _mm256_set1_epi32(Blockwise8BitMap::kLowestMagnitude)),
                       _mm256_set1_epi32(Blockwise8BitMap::kHighestMagnitude));
  const __m256i negative = _mm256_srai_epi32(bits, 31);  // all ones where the sign is set
  const __m256i index = _mm256_add_epi32(
      _mm256_srli_epi32(
          _mm256_sub_epi32(magnitude, _mm256_set1_epi32(Blockwise8BitMap::kLowestMagnitude)), 16),
      _mm256_and_si256(negative, _mm256_set1_epi32(Blockwise8BitMap::kLookupHalf)));
  const __m256i entry = _mm256_i32gather_epi32(reinterpret_cast<const int*>(map.lookup), index, 4);
  const __m256i low_bits = _mm256_set1_epi32(0xFFFF);
  const __m256i key =
      _mm256_xor_si256(_mm256_and_si256(bits, low_bits), _mm256_and_si256(negative, low_bits));
  // All ones (-1) where the key is above the split: subtracting adds one there. Both are below
  // 2^16, so the signed comparison is the unsigned one.
  const __m256i above = _mm256_cmpgt_epi32(key, _mm256_srli_epi32(entry, 16));
  const __m256i ordered = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_ORD_Q));
  return _mm256_and_si256(_mm256_sub_epi32(_mm256_and_si256(entry, low_bits), above), ordered);
}

struct Avx2Level8 {
  __attribute__((target("avx2"))) static void update(const AdamWStateBuffers& b, size_t lo,
                                                     size_t hi, size_t first,
                                                     const Blockwise8BitMap& m_map,
                                                     const Blockwise8BitMap& v_map, float m_scale,
                                                     float v_scale, const AdamWConstants& c,
                                                     BlockMoments& block) {
    const __m256 m_scales = _mm256_set1_ps(m_scale), v_scales = _mm256_set1_ps(v_scale);
    size_t i = lo;
    for (; i + 8 <= hi; i += 8) {
      __m256 p = _mm256_loadu_ps(b.params + i);
      __m256 m = decode8(m_map, b.moments.m_codes() + i, m_scales);
      __m256 v = decode8(v_map, b.moments.v_codes() + i, v_scales);
      adamw8(p, _mm256_loadu_ps(b.grads + i), m, v, c);
      _mm256_storeu_ps(b.params_out + i, p);
      _mm256_storeu_ps(block.m + (i - first), m);
      _mm256_storeu_ps(block.v + (i - first), v);
    }
    for (; i < hi; ++i)
      blockwise_8bit_element(b, i, first, m_map, v_map, m_scale, v_scale, c, block);
  }

  __attribute__((target("avx2"))) static float scale(const float* x, size_t n) {
    const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 largest = _mm256_setzero_ps();
    size_t i = 0;
    // max(|x|, largest): a NaN |x| yields `largest` (the second operand), as in the scalar loop.
    for (; i + 8 <= n; i += 8)
      largest = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), magnitude_bits), largest);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, largest);
    float result = blockwise_8bit_scale(x + i, n - i);
    for (float lane : lanes) result = lane > result ? lane : result;
    return result;
  }

  __attribute__((target("avx2"))) static void encode(const Blockwise8BitMap& map, const float* x,
                                                     size_t n, float divisor, uint8_t* codes) {
    const __m256 divisors = _mm256_set1_ps(divisor);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i code = code8(map, _mm256_div_ps(_mm256_loadu_ps(x + i), divisors));
      const __m128i words =
          _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(words, words));
    }
    encode_scalar(map, x, i, n, divisor, codes);
  }
};

void adamw_8bit_avx2(const AdamWStateBuffers& b, size_t begin, size_t end, const AdamWConstants& c,
                     std::span<const DecayRun> decay) {
  adamw_8bit<Avx2Level8>(b, begin, end, c, decay);
}

// ---- AVX-512 ---------------------------------------------------------------------------------
//
// Every lane selected, through the masked forms: the plain forms of many of these intrinsics pass
// GCC 12 an undefined vector and trip a false -Wmaybe-uninitialized (GCC bug 105593).
constexpr __mmask16 kAll = 0xFFFF;

__attribute__((target("avx512f"))) inline __m512 load_bf16x16(const uint16_t* bits) {
  const __m512i wide =
      _mm512_maskz_cvtepu16_epi32(kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits)));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, wide, 16));
}

__attribute__((target("avx512f"))) inline void store_bf16x16(uint16_t* out, __m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lowest_kept =
      _mm512_and_si512(_mm512_maskz_srli_epi32(kAll, bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_maskz_srli_epi32(
      kAll, _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lowest_kept), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FFF));
  _mm512_mask_cvtepi32_storeu_epi16(out, kAll, rounded);
}

struct Avx512Bf16 {
  __attribute__((target("avx512f"))) static void update(const AdamWStateBuffers& b, size_t lo,
                                                        size_t hi, const AdamWConstants& c) {
    size_t i = lo;
    for (; i + 16 <= hi; i += 16) {
      __m512 p = _mm512_loadu_ps(b.params + i);
      __m512 m = load_bf16x16(b.moments.m_bf16() + i), v = load_bf16x16(b.moments.v_bf16() + i);
      adamw16(p, _mm512_loadu_ps(b.grads + i), m, v, c);
      _mm512_storeu_ps(b.params_out + i, p);
      store_bf16x16(b.moments_out.m_bf16() + i, m);
      store_bf16x16(b.moments_out.v_bf16() + i, v);
    }
    for (; i < hi; ++i) bf16_element(b, i, c);
  }
};

void adamw_bf16_avx512(const AdamWStateBuffers& b, size_t begin, size_t end,
                       const AdamWConstants& c, std::span<const DecayRun> decay) {
  adamw_bf16<Avx512Bf16>(b, begin, end, c, decay);
}

__attribute__((target("avx512f"))) inline __m512 decode16(const Blockwise8BitMap& map,
                                                          const uint8_t* codes, __m512 scale) {
  const __m512i index =
      _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_mul_ps(_mm512_mask_i32gather_ps(_mm512_setzero_ps(), kAll, index, map.values, 4),
                       scale);
}

__attribute__((target("avx512f"))) inline __m512i code16(const Blockwise8BitMap& map, __m512 y) {
  const __m512i bits = _mm512_castps_si512(y);
  const __m512i magnitude = _mm512_maskz_min_epu32(
      kAll,
      _mm512_maskz_max_epu32(kAll, _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                             _mm512_set1_epi32(Blockwise8BitMap::kLowestMagnitude)),
      _mm512_set1_epi32(Blockwise8BitMap::kHighestMagnitude));
  const __mmask16 negative = _mm512_cmplt_epi32_mask(bits, _mm512_setzero_si512());
  const __m512i bucket = _mm512_maskz_srli_epi32(
      kAll, _mm512_sub_epi32(magnitude, _mm512_set1_epi32(Blockwise8BitMap::kLowestMagnitude)), 16);
  const __m512i index = _mm512_mask_add_epi32(bucket, negative, bucket,
                                              _mm512_set1_epi32(Blockwise8BitMap::kLookupHalf));
  const __m512i entry =
      _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), kAll, index, map.lookup, 4);
  const __m512i low_bits = _mm512_set1_epi32(0xFFFF);
  const __m512i key = _mm512_mask_xor_epi32(_mm512_and_si512(bits, low_bits), negative,
                                            _mm512_and_si512(bits, low_bits), low_bits);
  const __mmask16 above = _mm512_cmpgt_epi32_mask(key, _mm512_maskz_srli_epi32(kAll, entry, 16));
  const __mmask16 ordered = _mm512_cmp_ps_mask(y, y, _CMP_ORD_Q);
  const __m512i candidate = _mm512_and_si512(entry, low_bits);
  const __m512i code = _mm512_mask_add_epi32(candidate, above, candidate, _mm512_set1_epi32(1));
  return _mm512_maskz_mov_epi32(ordered, code);
}

struct Avx512Level8 {
  __attribute__((target("avx512f"))) static void update(
      const AdamWStateBuffers& b, size_t lo, size_t hi, size_t first, const Blockwise8BitMap& m_map,
      const Blockwise8BitMap& v_map, float m_scale, float v_scale, const AdamWConstants& c,
      BlockMoments& block) {
    const __m512 m_scales = _mm512_set1_ps(m_scale), v_scales = _mm512_set1_ps(v_scale);
    size_t i = lo;
    for (; i + 16 <= hi; i += 16) {
      __m512 p = _mm512_loadu_ps(b.params + i);
      __m512 m = decode16(m_map, b.moments.m_codes() + i, m_scales);
      __m512 v = decode16(v_map, b.moments.v_codes() + i, v_scales);
      adamw16(p, _mm512_loadu_ps(b.grads + i), m, v, c);
      _mm512_storeu_ps(b.params_out + i, p);
      _mm512_storeu_ps(block.m + (i - first), m);
      _mm512_storeu_ps(block.v + (i - first), v);
    }
    for (; i < hi; ++i)
      blockwise_8bit_element(b, i, first, m_map, v_map, m_scale, v_scale, c, block);
  }

  __attribute__((target("avx512f"))) static float scale(const float* x, size_t n) {
    const __m512i magnitude_bits = _mm512_set1_epi32(0x7FFFFFFF);
    __m512 largest = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 magnitude = _mm512_castsi512_ps(
          _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), magnitude_bits));
      largest = _mm512_maskz_max_ps(kAll, magnitude, largest);  // a NaN magnitude yields `largest`
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, largest);
    float result = blockwise_8bit_scale(x + i, n - i);
    for (float lane : lanes) result = lane > result ? lane : result;
    return result;
  }

  __attribute__((target("avx512f"))) static void encode(const Blockwise8BitMap& map, const float* x,
                                                        size_t n, float divisor, uint8_t* codes) {
    const __m512 divisors = _mm512_set1_ps(divisor);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i code = code16(map, _mm512_div_ps(_mm512_loadu_ps(x + i), divisors));
      _mm512_mask_cvtepi32_storeu_epi8(codes + i, kAll, code);
    }
    encode_scalar(map, x, i, n, divisor, codes);
  }
};

void adamw_8bit_avx512(const AdamWStateBuffers& b, size_t begin, size_t end,
                       const AdamWConstants& c, std::span<const DecayRun> decay) {
  adamw_8bit<Avx512Level8>(b, begin, end, c, decay);
}

#endif  // __x86_64__

// Throws unless `decay` covers [0, count).
void check_decay_runs(std::span<const DecayRun> decay, size_t count) {
  const size_t covered = decay.empty() ? 0 : decay.back().end;
  LAYUP_CHECK(count == 0 || covered >= count, "AdamW's decay runs cover ", covered, " elements of ",
              count);
}

}  // namespace

std::vector<DecayRun> decay_runs(const ParameterLayout& layout, const Span& span, size_t first,
                                 size_t count) {
  std::vector<DecayRun> runs;
  const size_t end = first + count;
  for (const TensorSpec& tensor : layout.tensors_in(span)) {
    const size_t lo = std::max(first, tensor.offset_in_span);
    const size_t hi = std::min(end, tensor.offset_in_span + tensor.count);
    if (lo >= hi) continue;
    if (!runs.empty() && runs.back().decay == tensor.weight_decay)
      runs.back().end = hi - first;
    else
      runs.push_back({hi - first, tensor.weight_decay});
  }
  return runs;
}

AdamWStateKernel adamw_state_kernel(OptimizerStateKind kind, AdamWIsa isa) {
  LAYUP_CHECK(kind != OptimizerStateKind::kFp32,
              "fp32 optimizer state runs the fp32 AdamW loops (adamw_kernel)");
  adamw_kernel(isa);  // refuses a level this binary or CPU does not have
  const bool bf16 = kind == OptimizerStateKind::kBf16;
#if defined(__x86_64__)
  if (isa == AdamWIsa::kAvx512) return bf16 ? adamw_bf16_avx512 : adamw_8bit_avx512;
  if (isa == AdamWIsa::kAvx2) return bf16 ? adamw_bf16_avx2 : adamw_8bit_avx2;
#endif
  return bf16 ? adamw_bf16_scalar : adamw_8bit_scalar;
}

size_t adamw_state_granule(OptimizerStateKind kind) {
  switch (kind) {
    case OptimizerStateKind::kFp32:
      return 16;
    case OptimizerStateKind::kBf16:
      return 32;
    case OptimizerStateKind::kBlockwise8Bit:
      return kBlock;
  }
  return kBlock;
}

ElementRange adamw_state_share(OptimizerStateKind kind, size_t count, int part, int parts) {
  return adamw_share(count, part, parts, adamw_state_granule(kind));
}

void check_state_part(OptimizerStateKind kind, const Span& span, size_t first, size_t count) {
  const size_t end = first + count;
  LAYUP_CHECK(end <= span.count, "elements ", first, "-", end, " are not all in a span of ",
              span.count);
  if (kind != OptimizerStateKind::kBlockwise8Bit) return;
  LAYUP_CHECK(
      first % kBlock == 0 && (end % kBlock == 0 || end == span.count), "elements ", first, "-", end,
      " of a span of ", span.count, " cut 8-bit optimizer state inside its blocks of ", kBlock,
      " values; a part must start and end at multiples of ", kBlock, " (or at the span's end)");
}

void adamw_update_state(const AdamWStateBuffers& b, size_t count, const AdamWStep& step,
                        std::span<const DecayRun> decay) {
  check_decay_runs(decay, count);
  if (count == 0) return;
  const AdamWConstants constants = adamw_constants(step, /*decay=*/true);
  const OptimizerStateKind kind = b.kind();
  if (kind == OptimizerStateKind::kFp32) {
    // Run by run through the fp32 loop, each split as adamw_update splits a tensor.
    const AdamWKernel kernel = default_adamw_kernel();
    size_t lo = 0;
    for (const DecayRun& run : decay) {
      const size_t hi = std::min(run.end, count);
      if (lo >= hi) continue;
      const AdamWConstants c = adamw_constants(step, run.decay);
      const AdamWBuffers piece = b.fp32().at(lo);
      const size_t n = hi - lo;
      if (n < kMinParallelCount) {
        kernel(piece, n, c);
      } else {
#pragma omp parallel
        {
          const ElementRange share = adamw_share(n, omp_get_thread_num(), omp_get_num_threads());
          if (share.end > share.begin) kernel(piece.at(share.begin), share.end - share.begin, c);
        }
      }
      lo = hi;
    }
    return;
  }
  const AdamWStateKernel kernel = adamw_state_kernel(kind, default_adamw_isa());
  if (count < kMinParallelCount) {
    kernel(b, 0, count, constants, decay);
    return;
  }
#pragma omp parallel
  {
    const ElementRange share =
        adamw_state_share(kind, count, omp_get_thread_num(), omp_get_num_threads());
    if (share.end > share.begin) kernel(b, share.begin, share.end, constants, decay);
  }
}

void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                       const float* grads, const AdamWMoments& moments, const AdamWStep& step) {
  if (moments.kind == OptimizerStateKind::kFp32) {
    adamw_update_span(layout, span, params, grads, moments.m_fp32(), moments.v_fp32(), step);
    return;
  }
  const std::vector<DecayRun> decay = decay_runs(layout, span, 0, span.count);
  adamw_update_state(AdamWStateBuffers::in_place(params, grads, moments), span.count, step, decay);
}

void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                            size_t count, float* params, const float* grads,
                            const AdamWMoments& moments, const AdamWStep& step) {
  check_state_part(moments.kind, span, first, count);
  if (moments.kind == OptimizerStateKind::kFp32) {
    adamw_update_span_part(layout, span, first, count, params, grads, moments.m_fp32(),
                           moments.v_fp32(), step);
    return;
  }
  const std::vector<DecayRun> decay = decay_runs(layout, span, first, count);
  adamw_update_state(AdamWStateBuffers::in_place(params, grads, moments), count, step, decay);
}

}  // namespace layup
