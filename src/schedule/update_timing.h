// When the layup schedule updates the blocks it updates on the host (see docs/schedules.md): as
// each block's gradient is handed on during backward (no clipping), once the step's global norm is
// known (deferred clipping), or during backward as if the step were not clipped, into the spare
// state, and again where it was (speculative clipping; both in docs/schedules.md, "Clipping").
// UpdateTiming is chosen once, from ScheduleOptions::speculative_clip; it hands each step the
// StepTiming its clip threshold calls for.
#pragma once

#include <limits>

namespace layup {

// What a block needs once the step's norm is known (and finite).
enum class BlockUpdate {
  kDone,     // updated during backward, and that update stands
  kNow,      // not updated yet: update it now, with the clip factor
  kRedo,     // updated speculatively, but the step is clipped: again, from the current state
  kCatchUp,  // not speculated on (the norm so far already called for clipping): update it now
};

// One step's timing. The consumer thread calls update_now during backward; step() calls the rest
// before the backward starts or after the consumer is done.
class StepTiming {
 public:
  virtual ~StepTiming() = default;
  // Whether blocks are updated as their gradient is handed on, during backward.
  virtual bool during_backward() const = 0;
  // Whether those updates write the spare state: the step promotes it once every span's update is
  // submitted, and one that is not applied restores the device copy of the blocks updated.
  virtual bool speculative() const { return false; }
  // Consumer, during_backward only, in consume order: whether a block whose gradient is complete,
  // with this sum of squares, is updated now.
  virtual bool update_now(double sum_sq) = 0;
  // step(): what block `layer` needs, updated during backward or not, in a step clipped or not.
  virtual BlockUpdate after_norm(int layer, bool updated, bool clipped) const = 0;
};

// No clipping: every block during backward, in place; one whose own gradient is not finite is
// not updated (the step is not applied).
class UnclippedTiming final : public StepTiming {
 public:
  bool during_backward() const override { return true; }
  bool update_now(double sum_sq) override;
  BlockUpdate after_norm(int layer, bool updated, bool clipped) const override;
};

// Deferred clipping: nothing during backward; every block once the norm is known.
class DeferredTiming final : public StepTiming {
 public:
  bool during_backward() const override { return false; }
  bool update_now(double) override { return false; }
  BlockUpdate after_norm(int layer, bool updated, bool clipped) const override;
};

// Speculative clipping: each block during backward as if unclipped, into the spare state, until
// the norm of the blocks consumed so far shows that the step is clipped.
class SpeculativeTiming final : public StepTiming {
 public:
  // A step with this clip threshold (> 0) starts.
  void begin(float clip_max_norm);
  bool during_backward() const override { return true; }
  bool speculative() const override { return true; }
  bool update_now(double sum_sq) override;
  BlockUpdate after_norm(int layer, bool updated, bool clipped) const override;

 private:
  // The consumer's: the sum of squares of the blocks consumed so far, and the bound past which
  // the step is clipped for certain (with a margin that keeps rounding away from the decision;
  // it only saves work, the norm decides).
  double sum_sq_ = 0.0;
  double limit_sq_ = std::numeric_limits<double>::infinity();
};

class UpdateTiming {
 public:
  explicit UpdateTiming(bool speculative_clip) : speculative_clip_(speculative_clip) {}
  // The timing of a step with this clip threshold: unclipped (<= 0), else speculative with
  // speculative_clip unless the last step was clipped or not applied (clipping comes in runs: the
  // first steps of a run, loss spikes; a failed speculation costs host bandwidth), else deferred.
  // Valid until the next begin_step.
  StepTiming& begin_step(float clip_max_norm);
  // Deferred whatever the threshold: for a schedule that updates after the norm in every step.
  StepTiming& deferred() { return deferred_; }
  // How the step ended: clipped, or not applied.
  void end_step(bool clipped) { last_step_clipped_ = clipped; }

 private:
  const bool speculative_clip_;
  bool last_step_clipped_ = false;
  UnclippedTiming unclipped_;
  DeferredTiming deferred_;
  SpeculativeTiming speculative_;
};

}  // namespace layup
