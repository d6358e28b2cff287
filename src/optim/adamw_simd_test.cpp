// Pins every SIMD level of the AdamW loop to the scalar level bit for bit, the scalar level to the
// loop adamw_update ran before the levels existed, the LAYUP_ADAMW_ISA override, and the split
// of a tensor into per-thread shares.
//
// Compiled with -ffp-contract=off (CMakeLists.txt), like adamw_simd.cpp, so that the reference
// loop below means the same operations as the one it was copied from did on a build without FMA.
#include "optim/adamw_simd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "optim/adamw.h"

namespace layup {
namespace {

// The body of adamw_update before the SIMD levels, word for word, without the OpenMP pragma.
void reference_adamw(float* params, const float* grads, float* m, float* v, size_t count,
                     const AdamWStep& step, bool decay) {
  const AdamWHyper& h = step.hyper;
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step.t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step.t);
  const float step_size = static_cast<float>(h.lr / bias_correction1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  const float decay_factor = decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  const float beta1 = h.beta1, beta2 = h.beta2, eps = h.eps, scale = step.grad_scale;
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i] * scale;
    const float m_i = beta1 * m[i] + (1.0f - beta1) * g;
    const float v_i = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = m_i;
    v[i] = v_i;
    params[i] = params[i] * decay_factor - step_size * m_i / (std::sqrt(v_i) * inv_sqrt_bc2 + eps);
  }
}

// params, grads, m and v, each with one spare float in front so a test can start them off the
// vector registers' alignment.
struct State {
  std::vector<float> params, grads, m, v;
};

State random_state(size_t count, uint64_t seed) {
  Rng rng(seed);
  State s{std::vector<float>(count + 1), std::vector<float>(count + 1),
          std::vector<float>(count + 1), std::vector<float>(count + 1)};
  for (size_t i = 0; i <= count; ++i) {
    s.params[i] = 0.1f * rng.normal();
    s.grads[i] = 0.01f * rng.normal();
    s.m[i] = 0.001f * rng.normal();
    const float root = 0.001f * rng.normal();
    s.v[i] = root * root;
  }
  // The corners of IEEE arithmetic every level must treat alike: a zero gradient and state (the
  // denominator is eps alone), a subnormal gradient, and one whose square overflows to infinity.
  const float corners[][4] = {{0.5f, 0.0f, 0.0f, 0.0f},
                              {-0.25f, 1e-40f, 1e-41f, 0.0f},
                              {1.0f, 1e30f, 0.0f, 0.0f},
                              {2.0f, -3e-20f, 1e-20f, 1e-39f}};
  for (size_t k = 0; k < 4 && k < count; ++k) {
    const size_t i = 1 + (k * 7919) % count;
    s.params[i] = corners[k][0];
    s.grads[i] = corners[k][1];
    s.m[i] = corners[k][2];
    s.v[i] = corners[k][3];
  }
  return s;
}

// The step of update number `k`: t, lr and the clip factor all change, the clip factor never 1.
AdamWStep step_number(int k) {
  AdamWStep step;
  step.hyper = {3e-3f * (1.0f + 0.1f * k), 0.9f, 0.95f, 1e-8f, 0.1f};
  step.t = 1 + 3 * k;
  step.grad_scale = 0.37f + 0.2f * k;
  return step;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_bits(const State& got, const State& expected, const std::string& where) {
  EXPECT_TRUE(same_bits(got.params, expected.params)) << "params differ: " << where;
  EXPECT_TRUE(same_bits(got.m, expected.m)) << "m differs: " << where;
  EXPECT_TRUE(same_bits(got.v, expected.v)) << "v differs: " << where;
}

// Empty, one element, below and just past a 16-wide vector, and many vectors with a tail (one
// loop's call: no worker split to cover here).
const size_t kSizes[] = {0, 1, 15, 17, 40009};

// Runs `a` and `b` side by side over several steps from the same state, for every size, with and
// without decay, aligned and one float off, and expects the same bits after every step.
template <class UpdateA, class UpdateB>
void expect_identical_updates(UpdateA a, UpdateB b) {
  for (size_t count : kSizes) {
    for (bool decay : {false, true}) {
      for (size_t offset : {0, 1}) {
        State sa = random_state(count, 11 + count), sb = sa;
        for (int k = 0; k < 4; ++k) {
          const AdamWStep step = step_number(k);
          a(sa.params.data() + offset, sa.grads.data() + offset, sa.m.data() + offset,
            sa.v.data() + offset, count, step, decay);
          b(sb.params.data() + offset, sb.grads.data() + offset, sb.m.data() + offset,
            sb.v.data() + offset, count, step, decay);
          expect_same_bits(sa, sb,
                           "count " + std::to_string(count) + ", decay " + std::to_string(decay) +
                               ", offset " + std::to_string(offset) + ", step " +
                               std::to_string(k));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Calls the loop of one level as adamw_update would.
struct LevelUpdate {
  AdamWKernel kernel;
  void operator()(float* p, const float* g, float* m, float* v, size_t count, const AdamWStep& step,
                  bool decay) const {
    kernel(AdamWBuffers::in_place(p, g, m, v), count, adamw_constants(step, decay));
  }
};

// Calls the loop of one level out of place: into separate outputs (each starting `shift` floats
// past a 64-byte line, plus `m_skew` more for m, so that the outputs are aligned alike or not),
// checks that the inputs were left alone, then copies the outputs back over them.
struct OutOfPlaceLevelUpdate {
  AdamWKernel kernel;
  size_t m_skew = 0;
  mutable size_t shift = 0;  // advances every call, so calls see every alignment
  void operator()(float* p, const float* g, float* m, float* v, size_t count, const AdamWStep& step,
                  bool decay) const {
    constexpr size_t kLine = 16;  // floats per 64-byte line
    shift = (shift + 5) % kLine;
    std::vector<float> storage(3 * (count + 2 * kLine) + kLine);
    float* base = storage.data();
    base += (kLine - (reinterpret_cast<uintptr_t>(base) / sizeof(float)) % kLine) % kLine;
    float* p_out = base + shift;
    float* m_out = p_out + count + kLine + m_skew;
    float* v_out = m_out + count + kLine - m_skew;
    const std::vector<float> p_in(p, p + count), m_in(m, m + count), v_in(v, v + count);
    kernel(AdamWBuffers{p, g, m, v, p_out, m_out, v_out}, count, adamw_constants(step, decay));
    EXPECT_TRUE(count == 0 || (std::memcmp(p_in.data(), p, count * sizeof(float)) == 0 &&
                               std::memcmp(m_in.data(), m, count * sizeof(float)) == 0 &&
                               std::memcmp(v_in.data(), v, count * sizeof(float)) == 0))
        << "an out-of-place update wrote to its inputs";
    std::copy(p_out, p_out + count, p);
    std::copy(m_out, m_out + count, m);
    std::copy(v_out, v_out + count, v);
  }
};

std::string env_name(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::kScalar:
      return "scalar";
    case AdamWIsa::kAvx2:
      return "avx2";
    case AdamWIsa::kAvx512:
      return "avx512";
    case AdamWIsa::kNeon:
      return "neon";
  }
  return "";
}

// Sets the process's AdamW defaults for one scope and puts back the plain ones.
class ScopedAdamWDefaults {
 public:
  explicit ScopedAdamWDefaults(const AdamWDefaults& defaults) { set_adamw_defaults(defaults); }
  ~ScopedAdamWDefaults() { set_adamw_defaults({}); }
};

TEST(AdamWSimd, ScalarLevelMatchesTheLoopAdamWUpdateRanBefore) {
  expect_identical_updates(LevelUpdate{adamw_kernel(AdamWIsa::kScalar)}, reference_adamw);
}

TEST(AdamWSimd, AdamWUpdateMatchesTheScalarLevel) {
  // adamw_update: the level chosen at run time, spread over the OpenMP threads.
  expect_identical_updates(adamw_update, LevelUpdate{adamw_kernel(AdamWIsa::kScalar)});
}

class AdamWSimdLevel : public ::testing::TestWithParam<AdamWIsa> {};

TEST_P(AdamWSimdLevel, MatchesTheScalarLevelBitForBit) {
  const AdamWIsa isa = GetParam();
  if (!adamw_isa_available(isa))
    GTEST_SKIP() << adamw_isa_name(isa) << " is not available on this CPU or in this build";
  expect_identical_updates(LevelUpdate{adamw_kernel(isa)},
                           LevelUpdate{adamw_kernel(AdamWIsa::kScalar)});
}

// Out of place (streaming stores on x86 where the outputs are aligned alike, plain stores where
// they are not), every level gives the bits of the scalar level in place.
TEST_P(AdamWSimdLevel, OutOfPlaceMatchesInPlaceBitForBit) {
  const AdamWIsa isa = GetParam();
  if (!adamw_isa_available(isa))
    GTEST_SKIP() << adamw_isa_name(isa) << " is not available on this CPU or in this build";
  for (size_t m_skew : {0, 3})
    expect_identical_updates(OutOfPlaceLevelUpdate{adamw_kernel(isa), m_skew},
                             LevelUpdate{adamw_kernel(AdamWIsa::kScalar)});
}

TEST(AdamWSimd, ScalarOutOfPlaceMatchesInPlaceBitForBit) {
  expect_identical_updates(OutOfPlaceLevelUpdate{adamw_kernel(AdamWIsa::kScalar)},
                           LevelUpdate{adamw_kernel(AdamWIsa::kScalar)});
}

INSTANTIATE_TEST_SUITE_P(EveryLevel, AdamWSimdLevel,
                         ::testing::Values(AdamWIsa::kAvx2, AdamWIsa::kAvx512, AdamWIsa::kNeon),
                         [](const ::testing::TestParamInfo<AdamWIsa>& info) {
                           return env_name(info.param);
                         });

// Streaming stores are an x86 matter: the scalar and NEON loops never stream, whatever the
// environment allows, so bench-adamw does not label their rows as streaming.
TEST(AdamWSimd, OnlyTheX86LevelsStream) {
  EXPECT_FALSE(adamw_isa_streams(AdamWIsa::kScalar));
  EXPECT_FALSE(adamw_isa_streams(AdamWIsa::kNeon));
  EXPECT_EQ(adamw_isa_streams(AdamWIsa::kAvx2), adamw_streaming_stores_allowed());
  EXPECT_EQ(adamw_isa_streams(AdamWIsa::kAvx512), adamw_streaming_stores_allowed());
}

TEST(AdamWSimd, LevelsAreListedLowestFirstAndTheBestIsAvailable) {
  const std::vector<AdamWIsa> levels = available_adamw_isas();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), AdamWIsa::kScalar);
  EXPECT_EQ(levels.back(), best_adamw_isa());
  EXPECT_TRUE(adamw_isa_available(default_adamw_isa()));
}

TEST(AdamWSimd, TheDefaultsChooseALowerLevel) {
  {
    ScopedAdamWDefaults defaults({AdamWIsa::kScalar});
    EXPECT_EQ(default_adamw_isa(), AdamWIsa::kScalar);
  }
  EXPECT_EQ(default_adamw_isa(), best_adamw_isa());
  for (AdamWIsa isa : available_adamw_isas()) {
    ScopedAdamWDefaults defaults({isa});
    EXPECT_EQ(default_adamw_isa(), isa) << env_name(isa);
  }
}

TEST(AdamWSimd, TheDefaultsTurnStreamingStoresOff) {
  EXPECT_TRUE(adamw_streaming_stores_allowed());
  ScopedAdamWDefaults defaults({std::nullopt, /*streaming_stores=*/false});
  EXPECT_FALSE(adamw_streaming_stores_allowed());
  EXPECT_FALSE(adamw_isa_streams(AdamWIsa::kAvx2));
  EXPECT_FALSE(adamw_isa_streams(AdamWIsa::kAvx512));
}

TEST(AdamWSimd, ForcingAnUnavailableLevelThrows) {
  std::optional<AdamWIsa> missing;
  for (AdamWIsa isa : {AdamWIsa::kAvx512, AdamWIsa::kAvx2, AdamWIsa::kNeon})
    if (!adamw_isa_available(isa)) missing = isa;
  if (!missing) GTEST_SKIP() << "every level is available here";
  try {
    parse_adamw_isa(env_name(*missing), "LAYUP_ADAMW_ISA");
    ADD_FAILURE() << "LAYUP_ADAMW_ISA=" << env_name(*missing) << " did not throw";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("LAYUP_ADAMW_ISA"), std::string::npos) << message;
    EXPECT_NE(message.find("available here: scalar"), std::string::npos) << message;
  }
  EXPECT_THROW(set_adamw_defaults({*missing}), Error);
  EXPECT_EQ(default_adamw_isa(), best_adamw_isa());
  EXPECT_THROW(adamw_kernel(*missing), Error);
}

TEST(AdamWSimd, AnUnknownLevelThrows) {
  EXPECT_THROW(parse_adamw_isa("sse9", "LAYUP_ADAMW_ISA"), Error);
  EXPECT_THROW(parse_adamw_isa("avx1024", "--isa"), Error);
}

TEST(AdamWSimd, SharesCoverEveryElementOnceAtLineBoundaries) {
  for (size_t count :
       {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000}, size_t{1000003}}) {
    for (int parts : {1, 2, 3, 7, 16, 64}) {
      size_t next = 0;
      for (int part = 0; part < parts; ++part) {
        const ElementRange share = adamw_share(count, part, parts);
        EXPECT_EQ(share.begin, next) << count << " " << parts << " " << part;
        EXPECT_LE(share.begin, share.end);
        if (share.end < count) {
          EXPECT_EQ(share.end % 16, 0u) << count << " " << parts;
        }
        next = share.end;
      }
      EXPECT_EQ(next, count) << count << " " << parts;
    }
  }
}

}  // namespace
}  // namespace layup
