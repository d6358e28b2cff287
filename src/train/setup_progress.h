// What a big run's set-up is doing before its first step: allocating the plan (pinning host
// memory runs at ~2 GB/s) and filling the fresh model span by span take minutes at 13B, which a
// silent process would leave unexplained. Small runs print nothing.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include "memory/memory_plan.h"
#include "train/progress_line.h"

namespace layup {

class SetupProgress {
 public:
  // Prints to `out` (null: nothing) when the plan holds at least kLoudFromBytes.
  SetupProgress(std::FILE* out, const MemoryPlan& plan);

  // Before the schedule allocates the plan: "set-up: allocating ...".
  void allocating();
  // After: how long it took.
  void allocated();
  // Before the fresh model of `parameters` is filled; the callback to hand initialize_fresh.
  std::function<void(size_t, size_t)> initializing(long long parameters);
  // After: how long it took, and the set-up's whole time.
  void initialized();

  static constexpr size_t kLoudFromBytes = size_t{8} << 30;

 private:
  double lap_s();  // seconds since the last lap, starting the next
  double since_lap_s() const;

  std::FILE* out_;
  const MemoryPlan& plan_;
  std::chrono::steady_clock::time_point started_, lap_started_;
  std::unique_ptr<ProgressLine> spans_line_;  // made at the first span, which knows the count
};

}  // namespace layup
