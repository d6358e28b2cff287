// Some of a model's spans packed one after another into buffers of their own, in layout order:
// how the host keeps the state of only the spans it updates, and the device its fp32 copy of only
// the spans that need one (docs/schedules.md, "Where each span's state lives").
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "model/parameter_layout.h"

namespace layup {

struct PackedSpans {
  static constexpr size_t kNotPacked = static_cast<size_t>(-1);

  std::vector<size_t> at;  // per span of the layout: its offset in the packed buffers
  size_t count = 0;        // floats the packed buffers hold

  // The spans of `layout` for which `keep(index)` holds.
  static PackedSpans of(const ParameterLayout& layout, const std::function<bool(size_t)>& keep) {
    PackedSpans packed;
    packed.at.assign(layout.spans().size(), kNotPacked);
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      if (!keep(index)) continue;
      packed.at[index] = packed.count;
      packed.count += layout.spans()[index].count;
    }
    return packed;
  }
  // Every span, at its offset in the layout.
  static PackedSpans all(const ParameterLayout& layout) {
    return of(layout, [](size_t) { return true; });
  }

  bool holds(size_t index) const { return at[index] != kNotPacked; }
};

}  // namespace layup
