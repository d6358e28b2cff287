// The AdamW element loop at each SIMD level (scalar, AVX2, AVX-512, NEON), and the choice among
// them at run time.
//
// Every level computes, for each element, exactly the operations of the scalar loop, in the same
// order and with the same rounding:
//   g = grad * grad_scale
//   m = beta1 m + (1 - beta1) g                     (two products, one sum)
//   v = beta2 v + ((1 - beta2) g) g                 (three products, one sum)
//   p = p decay_factor - (step_size m) / (sqrt(v) inv_sqrt_bias_correction2 + eps)
// IEEE single precision makes each of those a correctly rounded operation on every level (sqrt
// and division included: no reciprocal estimates), and this file and its users are compiled
// without FMA contraction (-ffp-contract=off, see CMakeLists.txt), so all levels produce the same
// bits. The schedules' equivalence tests and exact resume depend on that.
//
// The level is picked once per process (default_adamw_isa): the best one this binary was built
// with and this CPU runs, or a lower one given at start-up (set_adamw_defaults: the CLI reads
// LAYUP_ADAMW_ISA=scalar|avx2|avx512|neon, for tests and benchmarks, cli/environment.h). AVX2 and
// AVX-512 are chosen at run time on x86-64 (their loops are compiled with target attributes, so the
// baseline build needs no -mavx flags); NEON is part of every AArch64 CPU and is used whenever the
// build is for AArch64.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "optim/adamw.h"

namespace layup {

enum class AdamWIsa { kScalar, kAvx2, kAvx512, kNeon };

// The per-call constants of the element loop, computed once from the step (in double where
// PyTorch computes them in Python floats).
struct AdamWConstants {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float step_size;                  // lr / (1 - beta1^t)
  float inv_sqrt_bias_correction2;  // 1 / sqrt(1 - beta2^t)
  float decay_factor;               // 1 - lr wd, or 1 where the tensor does not decay
  float grad_scale;                 // the clip factor
};

AdamWConstants adamw_constants(const AdamWStep& step, bool decay);

// Where one call of an element loop reads the state and writes the new state. The output may be
// the input (an update in place) or memory that does not overlap it at all (the layup schedule's
// speculative update keeps the state it started from: docs/schedules.md, "Clipping").
struct AdamWBuffers {
  const float* params;
  const float* grads;
  const float* m;
  const float* v;
  float* params_out;
  float* m_out;
  float* v_out;

  // In place: the outputs are the inputs.
  static AdamWBuffers in_place(float* params, const float* grads, float* m, float* v) {
    return {params, grads, m, v, params, m, v};
  }
  // The same buffers `offset` elements further on.
  AdamWBuffers at(size_t offset) const {
    return {params + offset,     grads + offset, m + offset,    v + offset,
            params_out + offset, m_out + offset, v_out + offset};
  }
};

// Updates `count` elements; no alignment is required of the pointers. Out of place, the x86
// levels write with streaming stores where the outputs allow (the new state is not read again
// soon, and the stores then need not read the old lines first: 12 bytes per element less
// traffic); AdamWDefaults::streaming_stores (LAYUP_ADAMW_STREAM=0) turns them off.
using AdamWKernel = void (*)(const AdamWBuffers& buffers, size_t count, const AdamWConstants& c);

// Whether the out-of-place loops may use streaming stores (AdamWDefaults::streaming_stores).
bool adamw_streaming_stores_allowed();
// Whether `isa`'s out-of-place loop writes with streaming stores: the x86 levels, when allowed
// (scalar and NEON never stream).
bool adamw_isa_streams(AdamWIsa isa);

// "scalar", "AVX2", "AVX-512" or "NEON".
const char* adamw_isa_name(AdamWIsa isa);

// Whether this binary has the level's loop and this CPU can run it.
bool adamw_isa_available(AdamWIsa isa);

// The levels available here, lowest first (always starting with scalar).
std::vector<AdamWIsa> available_adamw_isas();

// The fastest available level.
AdamWIsa best_adamw_isa();

// "scalar", "avx2", "avx512" or "neon" as that level, "auto" (or "") as the best available one.
// Throws layup::Error for an unknown name or a level this binary or CPU does not have; the message
// names `source` (the flag or variable the name came from).
AdamWIsa parse_adamw_isa(std::string_view name, std::string_view source = "AdamW ISA");

// The process's AdamW defaults, given once at start-up before any update runs (the CLI parses
// them from LAYUP_ADAMW_ISA and LAYUP_ADAMW_STREAM: cli/environment.h); the library reads no
// environment variable.
struct AdamWDefaults {
  std::optional<AdamWIsa> isa;  // none: the best available level
  bool streaming_stores = true;
};
// Throws layup::Error for a level this binary or CPU does not have.
void set_adamw_defaults(const AdamWDefaults& defaults);

// The level AdamWDefaults names, else the best available one.
AdamWIsa default_adamw_isa();

// The loop of one level; throws layup::Error where the level is not available.
AdamWKernel adamw_kernel(AdamWIsa isa);

// The loop of default_adamw_isa().
AdamWKernel default_adamw_kernel();

// Share `part` of `parts` of [0, count): contiguous, in order, boundaries at multiples of
// `granule` elements (16 floats: 64 bytes, one cache line when the buffer is aligned, so that two
// threads never write the same line; optim/adamw_state.h cuts compact state at its own granule).
// Trailing shares may be empty.
struct ElementRange {
  size_t begin, end;
};
ElementRange adamw_share(size_t count, int part, int parts, size_t granule = 16);

}  // namespace layup
