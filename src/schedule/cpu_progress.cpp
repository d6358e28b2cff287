// CpuProgress: counters under one mutex, one condition variable for every wait.
#include "schedule/cpu_progress.h"

#include "core/error.h"

namespace layup {

void CpuProgress::transfer_starting() {
  std::lock_guard lock(mutex_);
  ++transfers_in_flight_;
}

void CpuProgress::transfer_abandoned() {
  {
    std::lock_guard lock(mutex_);
    --transfers_in_flight_;
  }
  changed_.notify_all();
}

void CpuProgress::update_landed(size_t span) {
  {
    std::lock_guard lock(mutex_);
    ++updates_landed_[span];
    --transfers_in_flight_;
  }
  changed_.notify_all();
}

void CpuProgress::fail(const std::string& what) {
  {
    std::lock_guard lock(mutex_);
    if (error_.empty()) error_ = what.empty() ? "unknown error" : what;
  }
  changed_.notify_all();
}

void CpuProgress::fail(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    fail(std::string(e.what()));
  } catch (...) {
    fail(std::string("unknown error"));
  }
}

bool CpuProgress::wait_landed(size_t span) const {
  std::unique_lock lock(mutex_);
  const auto landed = [&] {
    return !error_.empty() || updates_landed_[span] == updates_submitted_[span];
  };
  const bool waited = !landed();
  changed_.wait(lock, landed);
  throw_if_failed();
  return waited;
}

void CpuProgress::wait_all_landed() const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !error_.empty() || updates_landed_ == updates_submitted_; });
  throw_if_failed();
}

void CpuProgress::wait_transfers_landed() const noexcept {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return transfers_in_flight_ == 0; });
}

void CpuProgress::count(uint64_t& counter) {
  std::lock_guard lock(mutex_);
  ++counter;
}

void CpuProgress::count_and_notify(uint64_t& counter) {
  count(counter);
  changed_.notify_all();
}

void CpuProgress::wait_until_equal(const uint64_t& done, const uint64_t& submitted) const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !error_.empty() || done == submitted; });
  throw_if_failed();
}

void CpuProgress::throw_if_failed() const {
  LAYUP_CHECK(error_.empty(), "a CPU update of the layup schedule failed: ", error_);
}

}  // namespace layup
