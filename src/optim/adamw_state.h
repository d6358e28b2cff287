// AdamW on optimizer state of any kind (optim/adamw_moments.h): the loops for bf16 and 8-bit
// moments at each SIMD level, the worker shares they are cut into, and the span updates that run
// them. fp32 state goes to the loops of optim/adamw_simd.h, unchanged.
//
// Each element is updated with exactly the fp32 loop's operations (adamw_simd.h), from its
// decoded moments; the new moments are then encoded. An 8-bit block is updated whole: every
// element first (its weight written at once), then the block's new scales, then its codes from
// the new fp32 moments divided by their scale. Decoding, the scale (a maximum) and the code (a
// count, optim/adamw_moments.h) are exact or correctly rounded at every level, so every level
// gives the scalar loop's bits. The AVX2 and AVX-512 loops gather the map's entries; NEON runs
// the scalar loop.
//
// An 8-bit block must be updated by one call: a loop's range starts at a block boundary and ends
// at one or at the end of the state's run, which is how worker shares (adamw_state_share) and a
// rank's part of a span (check_state_part) are cut.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "model/parameter_layout.h"
#include "optim/adamw.h"
#include "optim/adamw_moments.h"
#include "optim/adamw_simd.h"

namespace layup {

// Consecutive elements that decay alike, up to `end` (counted from the run's first element, as
// the buffers are); a run's DecayRuns cover it in order.
struct DecayRun {
  size_t end;
  bool decay;
};

// The runs of elements [first, first + count) of a span, from its tensors' weight_decay, counted
// from `first`, neighbours that decay alike merged.
std::vector<DecayRun> decay_runs(const ParameterLayout& layout, const Span& span, size_t first,
                                 size_t count);

// Where one update reads the state and writes the new state, each pointer at the run's first
// element. The outputs are the inputs (in place) or overlap no input (the layup schedule's
// speculative update, docs/schedules.md); both moments are of one kind.
struct AdamWStateBuffers {
  const float* params;
  const float* grads;
  AdamWMoments moments;
  float* params_out;
  AdamWMoments moments_out;

  static AdamWStateBuffers in_place(float* params, const float* grads,
                                    const AdamWMoments& moments) {
    return {params, grads, moments, params, moments};
  }
  OptimizerStateKind kind() const { return moments.kind; }
  // The fp32 loops' buffers (for fp32 state only).
  AdamWBuffers fp32() const {
    return {params,
            grads,
            moments.m_fp32(),
            moments.v_fp32(),
            params_out,
            moments_out.m_fp32(),
            moments_out.v_fp32()};
  }
};

// Updates elements [begin, end) of a run, its buffers at element 0: begin starts a block (8bit),
// end ends one or the run. `c` holds the decaying elements' factor; the others use 1. `decay`
// covers [0, end) at least.
using AdamWStateKernel = void (*)(const AdamWStateBuffers& buffers, size_t begin, size_t end,
                                  const AdamWConstants& c, std::span<const DecayRun> decay);

// The loop for bf16 or 8-bit state at `isa` (the scalar loop where the level has none of its
// own, as on NEON); throws layup::Error for fp32 (adamw_kernel has its loops) or a level this
// binary or CPU does not have.
AdamWStateKernel adamw_state_kernel(OptimizerStateKind kind, AdamWIsa isa);

// How finely a run of `kind` is cut between workers: 16 elements (a 64-byte line of fp32), 32
// (a line of bf16), or one 8-bit block.
size_t adamw_state_granule(OptimizerStateKind kind);
// Share `part` of `parts` of [0, count), cut at that granule (adamw_share).
ElementRange adamw_state_share(OptimizerStateKind kind, size_t count, int part, int parts);

// Throws layup::Error unless elements [first, first + count) of `span` can be updated apart from
// the rest in `kind`: in 8bit, first must start a block of the span and the part must end at a
// block boundary or at the span's end, so that its blocks are the span's.
void check_state_part(OptimizerStateKind kind, const Span& span, size_t first, size_t count);

// AdamW on `count` elements where `buffers` say, split over the OpenMP threads of the caller;
// the default SIMD level (default_adamw_isa).
void adamw_update_state(const AdamWStateBuffers& buffers, size_t count, const AdamWStep& step,
                        std::span<const DecayRun> decay);

// adamw_update_span and adamw_update_span_part (optim/adamw.h) with the moments in any kind,
// in place; fp32 moments take the fp32 functions themselves. The part must pass
// check_state_part.
void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                       const float* grads, const AdamWMoments& moments, const AdamWStep& step);
void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                            size_t count, float* params, const float* grads,
                            const AdamWMoments& moments, const AdamWStep& step);

}  // namespace layup
