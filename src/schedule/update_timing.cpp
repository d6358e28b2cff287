// The layup schedule's update timings.
#include "schedule/update_timing.h"

#include <cmath>

#include "core/error.h"

namespace layup {

bool UnclippedTiming::update_now(double sum_sq) {
  return std::isfinite(sum_sq);
}

BlockUpdate UnclippedTiming::after_norm(int layer, bool updated, bool) const {
  LAYUP_CHECK(updated, "block ", layer, " missed its update during backward");
  return BlockUpdate::kDone;
}

BlockUpdate DeferredTiming::after_norm(int layer, bool updated, bool) const {
  LAYUP_CHECK(!updated, "block ", layer, " was updated before the norm was known");
  return BlockUpdate::kNow;
}

void SpeculativeTiming::begin(float clip_max_norm) {
  const double max_norm = clip_max_norm;
  sum_sq_ = 0.0;
  limit_sq_ = 1.0001 * max_norm * max_norm;
}

bool SpeculativeTiming::update_now(double sum_sq) {
  sum_sq_ += sum_sq;
  return std::isfinite(sum_sq) && sum_sq_ <= limit_sq_;
}

BlockUpdate SpeculativeTiming::after_norm(int, bool updated, bool clipped) const {
  if (!updated) return BlockUpdate::kCatchUp;
  return clipped ? BlockUpdate::kRedo : BlockUpdate::kDone;
}

StepTiming& UpdateTiming::begin_step(float clip_max_norm) {
  if (clip_max_norm <= 0.0f) return unclipped_;
  if (!speculative_clip_ || last_step_clipped_) return deferred_;
  speculative_.begin(clip_max_norm);
  return speculative_;
}

}  // namespace layup
