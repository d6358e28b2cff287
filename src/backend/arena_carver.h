// Buffers cut in order out of one allocation (a backend's region), each piece aligned within it.
// A backend runs the same sequence of take()s twice: with a null base to measure the region (what
// its *_buffers function lists and the memory plan sums), then over the allocation to place its
// pointers. Both passes hand out the same offsets.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "core/error.h"

namespace layup {

class ArenaCarver {
 public:
  // `owner` names whose buffers these are in the error for a size beyond 64 bits ("the CPU
  // backend's buffers at B=8, T=1024").
  ArenaCarver(char* base, size_t alignment, std::string owner)
      : base_(base), alignment_(alignment), owner_(std::move(owner)) {}

  // The next rows x cols elements of T, `alignment` bytes aligned (null while measuring). An absurd
  // shape whose bytes overflow 64 bits is an Error, not a wrapped size.
  template <class T>
  void take(T*& pointer, size_t rows, size_t cols = 1) {
    size_t bytes = 0, end = 0;
    const size_t start = (used_ + alignment_ - 1) / alignment_ * alignment_;
    LAYUP_CHECK(!__builtin_mul_overflow(rows, cols, &bytes) &&
                    !__builtin_mul_overflow(bytes, sizeof(T), &bytes) &&
                    !__builtin_add_overflow(start, bytes, &end),
                owner_, " overflow 64-bit sizes; use a smaller --batch or --seq-len");
    pointer = base_ != nullptr ? reinterpret_cast<T*>(base_ + start) : nullptr;
    used_ = end;
  }
  // Bytes handed out so far, the padding before each piece included.
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t alignment_;
  std::string owner_;
  size_t used_ = 0;
};

}  // namespace layup
