// AdamW on compact optimizer state: the scalar loop of each kind against a reference written out
// here element by element, every SIMD level against the scalar loop bit for bit (odd sizes and
// offsets, decay changing inside blocks, in place and out of place), worker shares and a rank's
// parts cut at whole blocks, and each kind training a small quadratic. HostAdamW's workers on
// compact state: host_adamw_test.cpp.
//
// Compiled with -ffp-contract=off (CMakeLists.txt), like the loops it checks.
#include "optim/adamw_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

constexpr OptimizerStateKind kCompactKinds[] = {OptimizerStateKind::kBf16,
                                                OptimizerStateKind::kBlockwise8Bit};
constexpr size_t kBlock = kOptimizerStateBlock;

// ---- the reference ----------------------------------------------------------------------------

// bf16 bits of x, to nearest even, written apart from the library's: keep the upper half, then
// add one where the dropped half is above a tie, or a tie with an odd kept half.
uint16_t reference_bf16(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  uint32_t kept = bits >> 16;
  const uint32_t dropped = bits & 0xFFFF;
  if (dropped > 0x8000 || (dropped == 0x8000 && (kept & 1))) ++kept;
  return static_cast<uint16_t>(kept);
}

// The nearest entry, ties to the lower one, 0 for a NaN (searched in double).
uint8_t reference_code(const Blockwise8BitMap& map, float y) {
  if (std::isnan(y)) return 0;
  // Beyond [-2, 2] the nearest entry is an end, and the distances would round alike in double.
  y = std::clamp(y, -2.0f, 2.0f);
  int best = 0;
  for (int k = 1; k < 256; ++k)
    if (std::fabs(static_cast<double>(y) - map.values[k]) <
        std::fabs(static_cast<double>(y) - map.values[best]))
      best = k;
  return static_cast<uint8_t>(best);
}

// One step over elements [0, count), the state's blocks from element 0, decaying where
// `decays[i]`: the fp32 update of adamw.h on the decoded moments, then the moments encoded, one
// element after another.
void reference_update(float* params, const float* grads, const AdamWMoments& moments, size_t count,
                      const AdamWStep& step, const std::vector<bool>& decays) {
  const AdamWHyper& h = step.hyper;
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step.t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step.t);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  std::vector<float> m(count), v(count);
  decode_moments(moments, count, m.data(), v.data());
  for (size_t i = 0; i < count; ++i) {
    const float decay_factor = decays[i] ? 1.0f - h.lr * h.weight_decay : 1.0f;
    const float g = grads[i] * step.grad_scale;
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * g * g;
    params[i] =
        params[i] * decay_factor - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + h.eps);
  }
  if (moments.kind == OptimizerStateKind::kBf16) {
    for (size_t i = 0; i < count; ++i) {
      moments.m_bf16()[i] = reference_bf16(m[i]);
      moments.v_bf16()[i] = reference_bf16(v[i]);
    }
    return;
  }
  for (size_t first = 0; first < count; first += kBlock) {
    const size_t end = std::min(count, first + kBlock);
    float m_scale = 0.0f, v_scale = 0.0f;
    for (size_t i = first; i < end; ++i) {
      if (!std::isnan(m[i])) m_scale = std::max(m_scale, std::fabs(m[i]));
      if (!std::isnan(v[i])) v_scale = std::max(v_scale, std::fabs(v[i]));
    }
    moments.m_scales[first / kBlock] = m_scale;
    moments.v_scales[first / kBlock] = v_scale;
    for (size_t i = first; i < end; ++i) {
      moments.m_codes()[i] =
          reference_code(signed_moment_map(), m_scale > 0 ? m[i] / m_scale : m[i]);
      moments.v_codes()[i] =
          reference_code(unsigned_moment_map(), v_scale > 0 ? v[i] / v_scale : v[i]);
    }
  }
}

// ---- state -----------------------------------------------------------------------------------

// Weights, gradients and moments of `count` elements in one kind, each array with `offset` spare
// elements in front so that a test can start it off the vector registers' alignment (and the
// codes off an 8-byte boundary).
struct State {
  OptimizerStateKind kind;
  size_t count, offset;
  std::vector<float> params, grads;
  std::vector<float> m32, v32, m_scales, v_scales;  // fp32 moments; 8-bit scales
  std::vector<uint16_t> m16, v16;
  std::vector<uint8_t> m8, v8;

  State(OptimizerStateKind kind, size_t count, size_t offset)
      : kind(kind), count(count), offset(offset), params(count + offset), grads(count + offset) {
    const size_t n = count + offset;
    if (kind == OptimizerStateKind::kFp32) m32 = v32 = std::vector<float>(n);
    if (kind == OptimizerStateKind::kBf16) m16 = v16 = std::vector<uint16_t>(n);
    if (kind == OptimizerStateKind::kBlockwise8Bit) {
      m8 = v8 = std::vector<uint8_t>(n);
      m_scales = v_scales = std::vector<float>(optimizer_state_blocks(count));
    }
  }
  AdamWMoments view() {
    switch (kind) {
      case OptimizerStateKind::kFp32:
        return AdamWMoments::fp32(m32.data() + offset, v32.data() + offset);
      case OptimizerStateKind::kBf16:
        return AdamWMoments::bf16(m16.data() + offset, v16.data() + offset);
      case OptimizerStateKind::kBlockwise8Bit:
        return AdamWMoments::blockwise_8bit(m8.data() + offset, v8.data() + offset, m_scales.data(),
                                            v_scales.data());
    }
    return {};
  }
  float* p() { return params.data() + offset; }
  const float* g() const { return grads.data() + offset; }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool operator==(const State& a, const State& b) {
  return same_bits(a.params, b.params) && same_bits(a.m32, b.m32) && same_bits(a.v32, b.v32) &&
         same_bits(a.m_scales, b.m_scales) && same_bits(a.v_scales, b.v_scales) && a.m16 == b.m16 &&
         a.v16 == b.v16 && a.m8 == b.m8 && a.v8 == b.v8;
}

// Some moments of every magnitude from earlier steps, and the corners of IEEE arithmetic: zero
// gradients and state, subnormals, a gradient whose square overflows.
State random_state(OptimizerStateKind kind, size_t count, size_t offset, uint64_t seed) {
  Rng rng(seed);
  State s(kind, count, offset);
  std::vector<float> m(count), v(count);
  for (size_t i = 0; i < count; ++i) {
    s.p()[i] = 0.1f * rng.normal();
    s.grads[offset + i] = 0.01f * rng.normal() * std::pow(10.0f, -4.0f * rng.uniform());
    m[i] = 0.001f * rng.normal() * std::pow(10.0f, -3.0f * rng.uniform());
    const float root = 0.001f * rng.normal();
    v[i] = root * root;
  }
  const float corners[][4] = {
      {0.5f, 0.0f, 0.0f, 0.0f}, {-0.25f, 1e-40f, 1e-41f, 0.0f}, {2.0f, -3e-20f, 1e-20f, 1e-39f}};
  for (size_t k = 0; k < 3 && k < count; ++k) {
    const size_t i = (k * 7919) % count;
    s.p()[i] = corners[k][0];
    s.grads[offset + i] = corners[k][1];
    m[i] = corners[k][2];
    v[i] = corners[k][3];
  }
  if (count > 3000) s.grads[offset + 2999] = 1e30f;  // its v overflows: one block goes non-finite
  encode_moments(m.data(), v.data(), count, s.view());
  return s;
}

AdamWStep step_number(int k) {
  AdamWStep step;
  step.hyper = {3e-3f * (1.0f + 0.1f * k), 0.9f, 0.95f, 1e-8f, 0.1f};
  step.t = 1 + 3 * k;
  step.grad_scale = 0.37f + 0.2f * k;
  return step;
}

// Decay runs that change inside blocks and pieces shorter than a vector.
std::vector<DecayRun> mixed_runs(size_t count) {
  std::vector<DecayRun> runs;
  const size_t lengths[] = {3, 100, 5, 700, 1, 13, 4096};
  bool decay = true;
  for (size_t end = 0, k = 0; end < count; ++k) {
    end = std::min(count, end + lengths[k % 7]);
    runs.push_back({end, decay});
    decay = !decay;
  }
  return runs;
}

std::vector<bool> decays_of(const std::vector<DecayRun>& runs, size_t count) {
  std::vector<bool> decays(count);
  size_t begin = 0;
  for (const DecayRun& run : runs) {
    for (size_t i = begin; i < run.end && i < count; ++i) decays[i] = run.decay;
    begin = run.end;
  }
  return decays;
}

AdamWConstants constants_of(const AdamWStep& step) {
  return adamw_constants(step, /*decay=*/true);
}

std::string where(OptimizerStateKind kind, size_t count, size_t offset, int step) {
  return name_of(kind) + ", count " + std::to_string(count) + ", offset " + std::to_string(offset) +
         ", step " + std::to_string(step);
}

// ---- the loops -------------------------------------------------------------------------------

TEST(AdamWState, ScalarLoopMatchesTheReference) {
  for (OptimizerStateKind kind : kCompactKinds) {
    for (size_t count : {size_t{1}, size_t{17}, size_t{255}, size_t{257}, size_t{3 * kBlock + 9}}) {
      State got = random_state(kind, count, 1, 5 + count), expected = got;
      const std::vector<DecayRun> runs = mixed_runs(count);
      for (int k = 0; k < 3; ++k) {
        const AdamWStep step = step_number(k);
        adamw_state_kernel(kind, AdamWIsa::kScalar)(
            AdamWStateBuffers::in_place(got.p(), got.g(), got.view()), 0, count, constants_of(step),
            runs);
        reference_update(expected.p(), expected.g(), expected.view(), count, step,
                         decays_of(runs, count));
        ASSERT_TRUE(got == expected) << where(kind, count, 1, k);
      }
    }
  }
}

// Calls a kind's loop at `isa` in place, or out of place into fresh outputs (then checks that the
// inputs were left alone and copies the outputs back).
void run_loop(AdamWStateKernel kernel, State& s, const AdamWStep& step,
              const std::vector<DecayRun>& runs, bool in_place) {
  if (in_place) {
    kernel(AdamWStateBuffers::in_place(s.p(), s.g(), s.view()), 0, s.count, constants_of(step),
           runs);
    return;
  }
  State out = s;
  const State before = s;
  kernel({s.p(), s.g(), s.view(), out.p(), out.view()}, 0, s.count, constants_of(step), runs);
  ASSERT_TRUE(s == before) << "an out-of-place update wrote to its inputs";
  s = out;
}

class AdamWStateLevel : public ::testing::TestWithParam<AdamWIsa> {};

TEST_P(AdamWStateLevel, MatchesTheScalarLoopBitForBit) {
  const AdamWIsa isa = GetParam();
  if (!adamw_isa_available(isa))
    GTEST_SKIP() << adamw_isa_name(isa) << " is not available on this CPU or in this build";
  for (OptimizerStateKind kind : kCompactKinds) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{256}, size_t{100003}}) {
      for (size_t offset : {0, 1, 3}) {
        for (bool in_place : {true, false}) {
          State got = random_state(kind, count, offset, 11 + count), expected = got;
          const std::vector<DecayRun> runs = mixed_runs(count);
          for (int k = 0; k < 3; ++k) {
            const AdamWStep step = step_number(k);
            run_loop(adamw_state_kernel(kind, isa), got, step, runs, in_place);
            run_loop(adamw_state_kernel(kind, AdamWIsa::kScalar), expected, step, runs, true);
            ASSERT_TRUE(got == expected)
                << where(kind, count, offset, k) << (in_place ? ", in place" : ", out of place");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, AdamWStateLevel,
                         ::testing::Values(AdamWIsa::kScalar, AdamWIsa::kAvx2, AdamWIsa::kAvx512,
                                           AdamWIsa::kNeon),
                         [](const ::testing::TestParamInfo<AdamWIsa>& info) {
                           const AdamWIsa isa = info.param;
                           return std::string(isa == AdamWIsa::kScalar   ? "scalar"
                                              : isa == AdamWIsa::kAvx2   ? "avx2"
                                              : isa == AdamWIsa::kAvx512 ? "avx512"
                                                                         : "neon");
                         });

TEST(AdamWState, Fp32StateHasNoLoopHere) {
  EXPECT_THROW(adamw_state_kernel(OptimizerStateKind::kFp32, AdamWIsa::kScalar), Error);
}

// ---- spans, shares and parts -----------------------------------------------------------------

// Width 40 is no multiple of 16 or of a block: tensors and blocks start anywhere.
ParameterLayout small_layout() {
  return ParameterLayout(gpt2_config(2, 2, 40, 8, 61));
}

TEST(AdamWState, DecayRunsCoverEachSpanAsItsTensorsDecay) {
  for (const ParameterLayout& layout :
       {small_layout(), ParameterLayout(llama_config(2, 4, 2, 64, 96, 16, 100))}) {
    for (const Span& span : layout.spans()) {
      const std::vector<DecayRun> runs = decay_runs(layout, span, 0, span.count);
      ASSERT_FALSE(runs.empty());
      EXPECT_EQ(runs.back().end, span.count);
      const std::vector<bool> decays = decays_of(runs, span.count);
      for (const TensorSpec& tensor : layout.tensors_in(span))
        for (size_t i = 0; i < tensor.count; ++i)
          ASSERT_EQ(decays[tensor.offset_in_span + i], tensor.weight_decay) << tensor.name;
      for (size_t r = 1; r < runs.size(); ++r) EXPECT_NE(runs[r].decay, runs[r - 1].decay);
      // Counted from a part's first element.
      const std::vector<DecayRun> part = decay_runs(layout, span, 7, span.count - 7);
      EXPECT_EQ(part.back().end, span.count - 7);
      EXPECT_EQ(decays_of(part, span.count - 7)[0], decays[7]);
    }
  }
}

// The spans' decay by tensor, through the state loops, is the fp32 span update's: with fp32
// moments the two paths are the same update.
TEST(AdamWState, Fp32MomentsTakeTheFp32SpanUpdate) {
  const ParameterLayout layout = small_layout();
  const Span& span = layout.spans()[1];
  State got = random_state(OptimizerStateKind::kFp32, span.count, 0, 9), expected = got;
  const AdamWStep step = step_number(1);
  adamw_update_span(layout, span, got.p(), got.g(), got.view(), step);
  adamw_update_span(layout, span, expected.p(), expected.g(), expected.view().m_fp32(),
                    expected.view().v_fp32(), step);
  EXPECT_TRUE(got == expected);
}

TEST(AdamWState, SharesCutAtTheKindsGranule) {
  for (OptimizerStateKind kind :
       {OptimizerStateKind::kFp32, OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    const size_t granule = adamw_state_granule(kind);
    for (size_t count : {size_t{0}, size_t{255}, size_t{257}, size_t{10 * kBlock + 3}}) {
      for (int parts : {1, 2, 3, 16}) {
        size_t next = 0;
        for (int part = 0; part < parts; ++part) {
          const ElementRange share = adamw_state_share(kind, count, part, parts);
          EXPECT_EQ(share.begin, next);
          if (share.end < count) {
            EXPECT_EQ(share.end % granule, 0u) << name_of(kind);
          }
          next = share.end;
        }
        EXPECT_EQ(next, count);
      }
    }
  }
  EXPECT_EQ(adamw_state_granule(OptimizerStateKind::kBlockwise8Bit), kBlock);
}

TEST(AdamWState, APartMustHoldWholeBlocks) {
  const Span span{SpanKind::kBlock, 0, 0, 3 * kBlock + 10};
  const OptimizerStateKind k8 = OptimizerStateKind::kBlockwise8Bit;
  EXPECT_NO_THROW(check_state_part(k8, span, 0, kBlock));
  EXPECT_NO_THROW(check_state_part(k8, span, kBlock, 2 * kBlock + 10));  // to the span's end
  EXPECT_THROW(check_state_part(k8, span, 100, kBlock), Error);          // starts inside a block
  EXPECT_THROW(check_state_part(k8, span, 0, kBlock + 1), Error);        // ends inside one
  EXPECT_THROW(check_state_part(k8, span, 0, span.count + 1), Error);    // past the span
  EXPECT_NO_THROW(check_state_part(OptimizerStateKind::kBf16, span, 100, 7));
}

// Parts at block boundaries, each with its own moments, give the whole span's bits; a part
// inside a block is refused.
TEST(AdamWState, PartsAtBlocksGiveTheWholeSpansBits) {
  const ParameterLayout layout(gpt2_config(1, 2, 64, 8, 61));
  const Span& span = layout.spans()[1];  // a block: tensors of 64 to 16384 elements
  const size_t cut = 2 * kBlock;
  ASSERT_GT(span.count, cut + kBlock);
  for (OptimizerStateKind kind : kCompactKinds) {
    State whole = random_state(kind, span.count, 0, 21);
    std::vector<float> m(span.count), v(span.count);
    decode_moments(whole.view(), span.count, m.data(), v.data());
    // The same state cut in two, each part's moments coded on its own.
    State first(kind, cut, 0), second(kind, span.count - cut, 0);
    std::copy(whole.p(), whole.p() + cut, first.p());
    std::copy(whole.g(), whole.g() + cut, first.grads.data());
    std::copy(whole.p() + cut, whole.p() + span.count, second.p());
    std::copy(whole.g() + cut, whole.g() + span.count, second.grads.data());
    encode_moments(m.data(), v.data(), span.count, whole.view());
    encode_moments(m.data(), v.data(), cut, first.view());
    encode_moments(m.data() + cut, v.data() + cut, span.count - cut, second.view());
    for (int k = 0; k < 2; ++k) {
      const AdamWStep step = step_number(k);
      adamw_update_span(layout, span, whole.p(), whole.g(), whole.view(), step);
      adamw_update_span_part(layout, span, 0, cut, first.p(), first.g(), first.view(), step);
      adamw_update_span_part(layout, span, cut, span.count - cut, second.p(), second.g(),
                             second.view(), step);
    }
    EXPECT_EQ(std::memcmp(whole.p(), first.p(), cut * sizeof(float)), 0) << name_of(kind);
    EXPECT_EQ(std::memcmp(whole.p() + cut, second.p(), (span.count - cut) * sizeof(float)), 0)
        << name_of(kind);
    std::vector<float> m_parts(span.count), v_parts(span.count);
    decode_moments(whole.view(), span.count, m.data(), v.data());
    decode_moments(first.view(), cut, m_parts.data(), v_parts.data());
    decode_moments(second.view(), span.count - cut, m_parts.data() + cut, v_parts.data() + cut);
    EXPECT_TRUE(same_bits(m, m_parts)) << name_of(kind);
    EXPECT_TRUE(same_bits(v, v_parts)) << name_of(kind);
  }
  State part(OptimizerStateKind::kBlockwise8Bit, kBlock, 0);
  EXPECT_THROW(adamw_update_span_part(layout, span, 100, kBlock, part.p(), part.g(), part.view(),
                                      step_number(0)),
               Error);
}

// ---- training --------------------------------------------------------------------------------

// 300 steps of AdamW on 0.5 sum a_i (p_i - t_i)^2, curvatures over three decades: each kind brings
// the loss down by the same orders of magnitude as fp32 (a loose check that compact state trains).
TEST(AdamWState, EveryKindTrainsAQuadraticAsFp32Does) {
  const size_t count = 4 * kBlock + 31;
  Rng rng(17);
  std::vector<float> curvature(count), target(count);
  for (size_t i = 0; i < count; ++i) {
    curvature[i] = std::pow(10.0f, 3.0f * rng.uniform() - 1.0f);
    target[i] = rng.normal();
  }
  const auto loss = [&](const std::vector<float>& p) {
    double sum = 0.0;
    for (size_t i = 0; i < count; ++i)
      sum += 0.5 * curvature[i] * (p[i] - target[i]) * (p[i] - target[i]);
    return sum;
  };
  const std::vector<DecayRun> runs = {{count, false}};
  double fp32_loss = 0.0;
  const double start = loss(std::vector<float>(count, 0.0f));
  for (OptimizerStateKind kind :
       {OptimizerStateKind::kFp32, OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    std::vector<float> p(count, 0.0f), g(count);
    std::vector<uint8_t> buffer(optimizer_moments_bytes(kind, count), 0);
    const AdamWMoments moments = AdamWMoments::in_buffer(kind, buffer.data(), count);
    AdamWStep step;
    step.hyper = {2e-2f, 0.9f, 0.95f, 1e-8f, 0.0f};
    for (int t = 1; t <= 300; ++t) {
      for (size_t i = 0; i < count; ++i) g[i] = curvature[i] * (p[i] - target[i]);
      step.t = t;
      step.hyper.lr = 2e-2f * (t <= 200 ? 1.0f : 0.1f);
      adamw_update_state(AdamWStateBuffers::in_place(p.data(), g.data(), moments), count, step,
                         runs);
    }
    const double final_loss = loss(p);
    if (kind == OptimizerStateKind::kFp32) fp32_loss = final_loss;
    EXPECT_LT(final_loss, start * 1e-3) << name_of(kind) << " from " << start;
    EXPECT_LT(final_loss, std::max(10.0 * fp32_loss, start * 1e-5)) << name_of(kind);
  }
}

}  // namespace
}  // namespace layup
