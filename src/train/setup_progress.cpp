// SetupProgress; see setup_progress.h.
#include "train/setup_progress.h"

#include <algorithm>
#include <string>

#include "memory/memory_accountant.h"

namespace layup {

SetupProgress::SetupProgress(std::FILE* out, const MemoryPlan& plan)
    : out_(plan.total_bytes() >= kLoudFromBytes ? out : nullptr),
      plan_(plan),
      started_(std::chrono::steady_clock::now()),
      lap_started_(started_) {}

double SetupProgress::since_lap_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - lap_started_).count();
}

double SetupProgress::lap_s() {
  const double seconds = since_lap_s();
  lap_started_ = std::chrono::steady_clock::now();
  return seconds;
}

void SetupProgress::allocating() {
  lap_s();
  if (!out_) return;
  size_t pinned = 0;
  for (const PlannedAllocation& allocation : plan_.allocations)
    if (allocation.accounted && allocation.kind == MemoryKind::kPinnedMapped)
      pinned += allocation.bytes;
  std::fprintf(out_, "set-up: allocating the plan: %s on the host (%s of it pinned), %s on the GPU",
               format_bytes(plan_.host_memory_bytes()).c_str(), format_bytes(pinned).c_str(),
               format_bytes(plan_.gpu_memory_bytes()).c_str());
  if (plan_.disk_bytes > 0)
    std::fprintf(out_, ", %s on disk", format_bytes(plan_.disk_bytes).c_str());
  std::fprintf(out_, "\n");
  std::fflush(out_);
}

void SetupProgress::allocated() {
  const double seconds = lap_s();
  if (out_) std::fprintf(out_, "set-up: allocated in %.1f s\n", seconds);
}

std::function<void(size_t, size_t)> SetupProgress::initializing(long long parameters) {
  lap_s();
  if (!out_) return {};
  std::fprintf(out_, "set-up: filling a fresh model of %.2fB parameters, span by span\n",
               parameters / 1e9);
  std::fflush(out_);
  return [this](size_t done, size_t spans) {
    const int total = static_cast<int>(spans);
    // About ten lines where the output is not a terminal (a log); one line redrawn where it is.
    if (!spans_line_)
      spans_line_ = std::make_unique<ProgressLine>(out_, total, std::max(1, total / 10));
    spans_line_->update(static_cast<int>(done), "set-up: span " + std::to_string(done) + "/" +
                                                    std::to_string(total) + " in, " +
                                                    ProgressLine::format_duration(since_lap_s()));
  };
}

void SetupProgress::initialized() {
  const double seconds = lap_s();
  if (!out_) return;
  if (spans_line_) spans_line_->finish();
  const double whole =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  std::fprintf(out_, "set-up: fresh model in %.1f s; %.1f s since the plan\n", seconds, whole);
  std::fflush(out_);
}

}  // namespace layup
