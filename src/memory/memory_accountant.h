// The accounting allocator's ledger: every byte a run allocates through a Device or a backend is
// recorded here by (side, tensor class, memory kind), with the current and the peak bytes of each
// cell, of each class, of each side and of the whole run.
//
// Allocators record; they do not ask. Device::allocate_kind (backend/device.h), which also serves
// the schedules' host-side state, and the CUDA backend's arena, staging and workspaces hold a
// MemoryRecord for as long as the memory lives, and the record gives its bytes back when it
// goes. The plan (memory/memory_plan.h) says before a run what these cells will
// hold; the ledger says what they held.
//
// Thread-safe: any thread may record and read.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "memory/planned_allocation.h"
#include "memory/tensor_class.h"

namespace layup {

// Bytes now and at most so far.
struct MemoryUsage {
  size_t current = 0;
  size_t peak = 0;
};

// One cell of the ledger: what one tensor class held in one memory kind on one side.
struct MemoryCell {
  MemorySide side;
  TensorClass tensor_class;
  MemoryKind kind;
  MemoryUsage usage;
};

class MemoryAccountant {
 public:
  void add(MemorySide side, TensorClass tensor_class, MemoryKind kind, size_t bytes);
  // Throws nothing: it runs in destructors. Removing more than was added is a bug in the caller
  // and clamps at zero.
  void remove(MemorySide side, TensorClass tensor_class, MemoryKind kind, size_t bytes) noexcept;

  MemoryUsage cell(MemorySide side, TensorClass tensor_class, MemoryKind kind) const;
  // A class on one side, all kinds together (its peak is the peak of that sum).
  MemoryUsage row(MemorySide side, TensorClass tensor_class) const;
  MemoryUsage side_total(MemorySide side) const;
  MemoryUsage total() const;
  // The cells that ever held memory, by side, class and kind in that order.
  std::vector<MemoryCell> cells() const;

  // A table: one row per class that held memory, by side; one column per kind in use, the
  // current bytes, and the peak of the row; the totals of each side and of the run with their
  // peaks.
  std::string report() const;
  // {"cells": [{side, class, kind, current_bytes, peak_bytes}...], "device_side": {current_bytes,
  // peak_bytes}, "host_side": {...}, "total": {...}}; cells that never held memory are left out.
  // As JSON text: this header is included by CUDA code that also includes the cuDNN frontend,
  // which bundles its own, different nlohmann::json; keeping the library out of the header keeps
  // the two apart.
  std::string to_json_text() const;

 private:
  static void grow(MemoryUsage& usage, size_t bytes);
  // cells(), for a caller that holds mutex_.
  std::vector<MemoryCell> cells_locked() const;

  mutable std::mutex mutex_;
  std::array<std::array<std::array<MemoryUsage, kMemoryKindCount>, kTensorClassCount>,
             kMemorySideCount>
      cells_{};
  std::array<std::array<MemoryUsage, kTensorClassCount>, kMemorySideCount> rows_{};
  std::array<MemoryUsage, kMemorySideCount> sides_{};
  MemoryUsage total_{};
};

// Bytes held in an accountant while this object lives (moved, the bytes move with it).
class MemoryRecord {
 public:
  MemoryRecord() = default;
  MemoryRecord(std::shared_ptr<MemoryAccountant> accountant, MemorySide side,
               TensorClass tensor_class, MemoryKind kind, size_t bytes);
  MemoryRecord(MemoryRecord&& other) noexcept { *this = std::move(other); }
  MemoryRecord& operator=(MemoryRecord&& other) noexcept;
  MemoryRecord(const MemoryRecord&) = delete;
  MemoryRecord& operator=(const MemoryRecord&) = delete;
  ~MemoryRecord() { reset(); }

  // Gives the bytes back now.
  void reset() noexcept;
  size_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<MemoryAccountant> accountant_;
  MemorySide side_ = MemorySide::kHost;
  TensorClass class_ = TensorClass::kScratch;
  MemoryKind kind_ = MemoryKind::kHost;
  size_t bytes_ = 0;
};

// The record of a listed buffer (planned_allocation.h) in `accountant` (null: none), under the
// list's side, class, kind and bytes.
inline MemoryRecord record_planned(std::shared_ptr<MemoryAccountant> accountant,
                                   const PlannedAllocation& planned) {
  return MemoryRecord(std::move(accountant), planned.side, planned.tensor_class, planned.kind,
                      planned.bytes);
}

// "2.88 GiB", "400.6 MiB", "8.0 KiB", "12 B": binary units, as --memory-budget reads them.
std::string format_bytes(size_t bytes);

}  // namespace layup
