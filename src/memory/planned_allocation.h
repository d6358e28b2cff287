// One buffer a component will allocate, described before it is: where it lives (side, memory
// kind), what it holds (tensor class) and how many bytes. Components (the backends, the devices,
// the schedules and their policies) each list theirs in one function that their constructor
// allocates from; the memory plan only sums those lists (docs/memory.md).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "memory/tensor_class.h"

namespace layup {

struct PlannedAllocation {
  MemorySide side;
  TensorClass tensor_class;
  MemoryKind kind;
  size_t bytes;
  std::string what;
  // Goes through a Device or a backend, which record it in the MemoryAccountant while it lives:
  // the end-of-run report compares it with what was measured. Otherwise planned only.
  bool accounted = true;
  // Held only for a moment beside everything else (the initial or loaded state on its way into
  // the schedule, the state copied out for a checkpoint): counted in the side's and the host
  // memory's peak, not in its class.
  bool transient = false;

  size_t floats() const { return bytes / sizeof(float); }
};

using BufferList = std::vector<PlannedAllocation>;

// `to` followed by `more`.
inline void append(BufferList& to, const BufferList& more) {
  to.insert(to.end(), more.begin(), more.end());
}

}  // namespace layup
