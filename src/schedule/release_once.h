// ReleaseOnce: an action that gives something back (a gradient slot, a landing buffer) exactly
// once: when a holder says it is done (now()), else when the last holder lets go, so that a task
// that throws or is dropped still gives back what it held.
//
// Memory ordering: the first caller of now() (or the destructor) runs the action; an atomic
// exchange decides who, so two threads calling now() at once run it once. A caller that loses
// returns at once, without waiting for the action to finish: the action orders what it hands
// back itself (WeightGradSlots::release takes the slots' mutex).
#pragma once

#include <atomic>
#include <functional>
#include <utility>

namespace layup {

class ReleaseOnce {
 public:
  explicit ReleaseOnce(std::function<void()> action) : action_(std::move(action)) {}
  ReleaseOnce(const ReleaseOnce&) = delete;
  ReleaseOnce& operator=(const ReleaseOnce&) = delete;
  ~ReleaseOnce() { now(); }

  // Runs the action unless it has run.
  void now() {
    if (!done_.exchange(true, std::memory_order_acq_rel) && action_) action_();
  }

 private:
  const std::function<void()> action_;
  std::atomic<bool> done_{false};
};

}  // namespace layup
