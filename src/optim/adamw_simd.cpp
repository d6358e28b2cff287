// The AdamW element loops (scalar, AVX2, AVX-512, NEON) and the run-time choice among them.
//
// Compiled with -ffp-contract=off (CMakeLists.txt): GCC implements _mm256_mul_ps and friends as
// plain vector arithmetic, so without that flag it would fuse a product and a sum into an FMA
// wherever the target has one (always under -march=native on a recent CPU, and inside the
// target("avx512f") functions), rounding once instead of twice and breaking bitwise agreement
// with the scalar loop.
#include "optim/adamw_simd.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "optim/adamw_lanes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace layup {

namespace {

// One element, in the operation order every level follows (see adamw_simd.h). Every input is read
// before an output is written, so it updates in place too.
inline void adamw_element(const AdamWBuffers& b, size_t i, const AdamWConstants& c) {
  float p = b.params[i], m = b.m[i], v = b.v[i];
  adamw_lane(p, b.grads[i], m, v, c);
  b.m_out[i] = m;
  b.v_out[i] = v;
  b.params_out[i] = p;
}

void adamw_scalar(const AdamWBuffers& b, size_t count, const AdamWConstants& c) {
  for (size_t i = 0; i < count; ++i) adamw_element(b, i, c);
}

#if defined(__x86_64__)

constexpr size_t kNoStreaming = ~size_t{0};

// Out of place, how many elements to update one by one before all three outputs are aligned to
// `alignment` bytes, as streaming stores need (at most `count`); kNoStreaming in place, or where
// the outputs are not aligned alike.
size_t streaming_peel(const AdamWBuffers& b, size_t count, uintptr_t alignment) {
  if (b.params_out == b.params || !adamw_streaming_stores_allowed()) return kNoStreaming;
  const auto misalignment = [&](const float* p) {
    return reinterpret_cast<uintptr_t>(p) % alignment;
  };
  const uintptr_t off = misalignment(b.params_out);
  if (off % sizeof(float) != 0 || misalignment(b.m_out) != off || misalignment(b.v_out) != off)
    return kNoStreaming;
  return std::min<size_t>(count, off == 0 ? 0 : (alignment - off) / sizeof(float));
}

__attribute__((target("avx2"))) void adamw_avx2(const AdamWBuffers& b, size_t count,
                                                const AdamWConstants& c) {
  const size_t peel = streaming_peel(b, count, 32);
  const bool stream = peel != kNoStreaming;
  size_t i = 0;
  if (stream)
    for (; i < peel; ++i) adamw_element(b, i, c);
  for (; i + 8 <= count; i += 8) {
    __m256 p_i = _mm256_loadu_ps(b.params + i), m_i = _mm256_loadu_ps(b.m + i);
    __m256 v_i = _mm256_loadu_ps(b.v + i);
    adamw8(p_i, _mm256_loadu_ps(b.grads + i), m_i, v_i, c);
    if (stream) {
      _mm256_stream_ps(b.params_out + i, p_i);
      _mm256_stream_ps(b.m_out + i, m_i);
      _mm256_stream_ps(b.v_out + i, v_i);
    } else {
      _mm256_storeu_ps(b.params_out + i, p_i);
      _mm256_storeu_ps(b.m_out + i, m_i);
      _mm256_storeu_ps(b.v_out + i, v_i);
    }
  }
  for (; i < count; ++i) adamw_element(b, i, c);
  // Streaming stores are weakly ordered: fence them before the caller hands the results on.
  if (stream) _mm_sfence();
}

__attribute__((target("avx512f"))) void adamw_avx512(const AdamWBuffers& b, size_t count,
                                                     const AdamWConstants& c) {
  const size_t peel = streaming_peel(b, count, 64);
  const bool stream = peel != kNoStreaming;
  size_t i = 0;
  if (stream)
    for (; i < peel; ++i) adamw_element(b, i, c);
  for (; i + 16 <= count; i += 16) {
    __m512 p_i = _mm512_loadu_ps(b.params + i), m_i = _mm512_loadu_ps(b.m + i);
    __m512 v_i = _mm512_loadu_ps(b.v + i);
    adamw16(p_i, _mm512_loadu_ps(b.grads + i), m_i, v_i, c);
    if (stream) {
      _mm512_stream_ps(b.params_out + i, p_i);
      _mm512_stream_ps(b.m_out + i, m_i);
      _mm512_stream_ps(b.v_out + i, v_i);
    } else {
      _mm512_storeu_ps(b.params_out + i, p_i);
      _mm512_storeu_ps(b.m_out + i, m_i);
      _mm512_storeu_ps(b.v_out + i, v_i);
    }
  }
  if (i < count) {
    // The last 1-15 elements under a mask: masked-off lanes load zeros and are never stored, and
    // a masked load does not fault on the memory past the end.
    const __mmask16 mask = static_cast<__mmask16>((1u << (count - i)) - 1u);
    __m512 p_i = _mm512_maskz_loadu_ps(mask, b.params + i);
    __m512 m_i = _mm512_maskz_loadu_ps(mask, b.m + i);
    __m512 v_i = _mm512_maskz_loadu_ps(mask, b.v + i);
    adamw16(p_i, _mm512_maskz_loadu_ps(mask, b.grads + i), m_i, v_i, c);
    _mm512_mask_storeu_ps(b.params_out + i, mask, p_i);
    _mm512_mask_storeu_ps(b.m_out + i, mask, m_i);
    _mm512_mask_storeu_ps(b.v_out + i, mask, v_i);
  }
  // Streaming stores are weakly ordered: fence them before the caller hands the results on.
  if (stream) _mm_sfence();
}

#endif  // __x86_64__

#if defined(__aarch64__)

void adamw_neon(const AdamWBuffers& b, size_t count, const AdamWConstants& c) {
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    float32x4_t p_i = vld1q_f32(b.params + i), m_i = vld1q_f32(b.m + i), v_i = vld1q_f32(b.v + i);
    adamw4(p_i, vld1q_f32(b.grads + i), m_i, v_i, c);
    vst1q_f32(b.params_out + i, p_i);
    vst1q_f32(b.m_out + i, m_i);
    vst1q_f32(b.v_out + i, v_i);
  }
  for (; i < count; ++i) adamw_element(b, i, c);
}

#endif  // __aarch64__

// Why a level is missing here, or "" when it is available.
std::string unavailable_reason(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::kScalar:
      return "";
    case AdamWIsa::kAvx2:
    case AdamWIsa::kAvx512:
#if defined(__x86_64__)
      // libgcc's check includes the OS's support for the wider registers (XCR0), not only the
      // CPUID bit.
      __builtin_cpu_init();
      if (isa == AdamWIsa::kAvx2 && !__builtin_cpu_supports("avx2"))
        return "this CPU does not support AVX2";
      if (isa == AdamWIsa::kAvx512 && !__builtin_cpu_supports("avx512f"))
        return "this CPU does not support AVX-512F";
      return "";
#else
      return "this build is not for x86-64";
#endif
    case AdamWIsa::kNeon:
#if defined(__aarch64__)
      return "";
#else
      return "this build is not for AArch64";
#endif
  }
  return "unknown level";
}

std::string available_list() {
  std::string list;
  for (AdamWIsa isa : available_adamw_isas()) {
    if (!list.empty()) list += ", ";
    list += adamw_isa_name(isa);
  }
  return list;
}

// Set before any update runs (set_adamw_defaults), then only read: no lock.
AdamWDefaults& process_defaults() {
  static AdamWDefaults defaults;
  return defaults;
}

}  // namespace

void set_adamw_defaults(const AdamWDefaults& defaults) {
  if (defaults.isa) adamw_kernel(*defaults.isa);  // refuses a level this CPU does not have
  process_defaults() = defaults;
}

bool adamw_streaming_stores_allowed() {
  return process_defaults().streaming_stores;
}

bool adamw_isa_streams(AdamWIsa isa) {
  return (isa == AdamWIsa::kAvx2 || isa == AdamWIsa::kAvx512) && adamw_streaming_stores_allowed();
}

AdamWConstants adamw_constants(const AdamWStep& step, bool decay) {
  const AdamWHyper& h = step.hyper;
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), step.t);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), step.t);
  AdamWConstants c;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = 1.0f - h.beta1;
  c.beta2 = h.beta2;
  c.one_minus_beta2 = 1.0f - h.beta2;
  c.eps = h.eps;
  c.step_size = static_cast<float>(h.lr / bias_correction1);
  c.inv_sqrt_bias_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  c.decay_factor = decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  c.grad_scale = step.grad_scale;
  return c;
}

const char* adamw_isa_name(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::kScalar:
      return "scalar";
    case AdamWIsa::kAvx2:
      return "AVX2";
    case AdamWIsa::kAvx512:
      return "AVX-512";
    case AdamWIsa::kNeon:
      return "NEON";
  }
  return "unknown";
}

bool adamw_isa_available(AdamWIsa isa) {
  return unavailable_reason(isa).empty();
}

std::vector<AdamWIsa> available_adamw_isas() {
  std::vector<AdamWIsa> levels;
  for (AdamWIsa isa : {AdamWIsa::kScalar, AdamWIsa::kAvx2, AdamWIsa::kAvx512, AdamWIsa::kNeon})
    if (adamw_isa_available(isa)) levels.push_back(isa);
  return levels;
}

AdamWIsa best_adamw_isa() {
  if (adamw_isa_available(AdamWIsa::kAvx512)) return AdamWIsa::kAvx512;
  if (adamw_isa_available(AdamWIsa::kAvx2)) return AdamWIsa::kAvx2;
  if (adamw_isa_available(AdamWIsa::kNeon)) return AdamWIsa::kNeon;
  return AdamWIsa::kScalar;
}

AdamWIsa parse_adamw_isa(std::string_view name, std::string_view source) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower.empty() || lower == "auto") return best_adamw_isa();
  AdamWIsa isa;
  if (lower == "scalar") {
    isa = AdamWIsa::kScalar;
  } else if (lower == "avx2") {
    isa = AdamWIsa::kAvx2;
  } else if (lower == "avx512") {
    isa = AdamWIsa::kAvx512;
  } else if (lower == "neon") {
    isa = AdamWIsa::kNeon;
  } else {
    fail(source, " '", name, "' names no AdamW loop: use scalar, avx2, avx512, neon or auto");
  }
  const std::string reason = unavailable_reason(isa);
  LAYUP_CHECK(reason.empty(), source, " '", name, "' asks for the ", adamw_isa_name(isa),
              " AdamW loop, but ", reason, "; available here: ", available_list());
  return isa;
}

AdamWIsa default_adamw_isa() {
  static const AdamWIsa best = best_adamw_isa();
  return process_defaults().isa.value_or(best);
}

AdamWKernel adamw_kernel(AdamWIsa isa) {
  const std::string reason = unavailable_reason(isa);
  LAYUP_CHECK(reason.empty(), "the ", adamw_isa_name(isa), " AdamW loop is not available: ", reason,
              "; available here: ", available_list());
  switch (isa) {
    case AdamWIsa::kScalar:
      return adamw_scalar;
#if defined(__x86_64__)
    case AdamWIsa::kAvx2:
      return adamw_avx2;
    case AdamWIsa::kAvx512:
      return adamw_avx512;
#endif
#if defined(__aarch64__)
    case AdamWIsa::kNeon:
      return adamw_neon;
#endif
    default:
      break;
  }
  fail("no AdamW loop for ", adamw_isa_name(isa));
}

AdamWKernel default_adamw_kernel() {
  static const AdamWKernel kernel = adamw_kernel(default_adamw_isa());
  return kernel;
}

ElementRange adamw_share(size_t count, int part, int parts, size_t granule) {
  const size_t granules = (count + granule - 1) / granule;
  const size_t n = static_cast<size_t>(parts), k = static_cast<size_t>(part);
  // Whole granules dealt out as evenly as they go: shares differ by at most one granule.
  const size_t begin = std::min(count, granules * k / n * granule);
  const size_t end = std::min(count, granules * (k + 1) / n * granule);
  return {begin, end};
}

}  // namespace layup
