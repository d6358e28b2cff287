// The AdamW moments of some spans (or of a rank's part of each) packed one after another into one
// buffer in the run's optimizer state kind (docs/optimizer_state.md): each span's laid out by
// AdamWMoments::in_buffer from its first element, since 8-bit blocks count from there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/run_choices.h"
#include "model/parameter_layout.h"
#include "optim/adamw_moments.h"

namespace layup {

struct PackedMoments {
  static constexpr size_t kNotPacked = static_cast<size_t>(-1);

  OptimizerStateKind kind = OptimizerStateKind::kFp32;
  std::vector<size_t> at;      // per span of the layout: its moments' byte offset, or kNotPacked
  std::vector<size_t> counts;  // per span: the elements whose moments are held (0: none)
  size_t bytes = 0;            // of the buffer, a multiple of 4

  // The bytes one run of `count` elements takes, rounded up to whole floats: the buffers are
  // floats, and an 8-bit run's block scales that follow it must be 4-byte aligned. fp32 and bf16
  // runs take no padding.
  static size_t padded_bytes(OptimizerStateKind kind, size_t count) {
    return optimizer_moments_padded_bytes(kind, count);
  }

  // The moments of `counts[i]` elements of span i, for each span (0: none), in layout order.
  static PackedMoments of_counts(OptimizerStateKind kind, std::vector<size_t> counts) {
    PackedMoments packed;
    packed.kind = kind;
    packed.at.assign(counts.size(), kNotPacked);
    for (size_t index = 0; index < counts.size(); ++index) {
      if (counts[index] == 0) continue;
      packed.at[index] = packed.bytes;
      packed.bytes += padded_bytes(kind, counts[index]);
    }
    packed.counts = std::move(counts);
    return packed;
  }
  // The whole moments of the spans of `layout` for which `keep(index)` holds.
  static PackedMoments of(OptimizerStateKind kind, const ParameterLayout& layout,
                          const std::function<bool(size_t)>& keep) {
    std::vector<size_t> counts(layout.spans().size(), 0);
    for (size_t index = 0; index < counts.size(); ++index)
      if (keep(index)) counts[index] = layout.spans()[index].count;
    return of_counts(kind, std::move(counts));
  }
  static PackedMoments all(OptimizerStateKind kind, const ParameterLayout& layout) {
    return of(kind, layout, [](size_t) { return true; });
  }

  bool holds(size_t index) const { return at[index] != kNotPacked; }
  size_t floats() const { return bytes / sizeof(float); }
  // Span `index`'s moments in `buffer` (the packed buffer's first float): where they start, how
  // many floats they take, and where each moment lies.
  float* base(float* buffer, size_t index) const { return buffer + at[index] / sizeof(float); }
  size_t floats(size_t index) const { return padded_bytes(kind, counts[index]) / sizeof(float); }
  AdamWMoments in(float* buffer, size_t index) const {
    return AdamWMoments::in_buffer(kind, base(buffer, index), counts[index]);
  }
};

}  // namespace layup
