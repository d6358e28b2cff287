// CpuProgress: what the layup schedule's CPU side has finished, for the threads that wait on it:
// the consumes of the current step's gradients (the step needs every sum of squares for the
// norm), the landing of the head's gradient on the host, and per span the updates submitted and
// those whose new weights have landed in the device copy (a forward waits for its span's, export
// for all). The counters only grow, so a step never resets state that an update of the step
// before may still be about to report.
//
// Memory ordering: a task's writes (host state, the device copy, a sum of squares) happen before
// it reports under mutex_; a waiter returns only after reading the report under mutex_, so it
// then sees them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace layup {

class CpuProgress {
 public:
  explicit CpuProgress(size_t spans) : updates_submitted_(spans, 0), updates_landed_(spans, 0) {}

  void consume_submitted() { count(consumes_submitted_); }
  void consume_done() { count_and_notify(consumes_done_); }
  // The head's gradient of a step on its way to the host, which may land after its consume
  // reported done (its sums of squares are the device's).
  void head_landing_submitted() { count(head_landings_submitted_); }
  void head_landed() { count_and_notify(head_landings_done_); }
  void update_submitted(size_t span) { count(updates_submitted_[span]); }
  // A transfer of new weights is about to start (its landing calls update_landed), or did not
  // start after all (transfer_abandoned).
  void transfer_starting();
  void transfer_abandoned();
  void update_landed(size_t span);
  // The first failure of a task; every wait from now on throws it.
  void fail(const std::string& what);
  void fail(const std::exception_ptr& error);

  void wait_consumed() const { wait_until_equal(consumes_done_, consumes_submitted_); }
  // Until the head's gradient of the last step is on the host: the backward overwrites it.
  void wait_head_landed() const { wait_until_equal(head_landings_done_, head_landings_submitted_); }
  // Until span `span`'s updates have landed; returns whether it had to wait.
  bool wait_landed(size_t span) const;
  void wait_all_landed() const;
  // Until no transfer started is still in flight, failure or not: their completion handlers use
  // this object and the schedule. Never throws.
  void wait_transfers_landed() const noexcept;

 private:
  void count(uint64_t& counter);
  void count_and_notify(uint64_t& counter);
  // Until a pair of counters agree, or a task failed (then throws).
  void wait_until_equal(const uint64_t& done, const uint64_t& submitted) const;
  void throw_if_failed() const;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  uint64_t consumes_submitted_ = 0, consumes_done_ = 0;
  uint64_t head_landings_submitted_ = 0, head_landings_done_ = 0;
  std::vector<uint64_t> updates_submitted_, updates_landed_;
  int64_t transfers_in_flight_ = 0;
  std::string error_;
};

}  // namespace layup
