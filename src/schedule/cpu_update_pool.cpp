// CpuUpdatePool: worker threads with one shared queue.
#include "schedule/cpu_update_pool.h"

#include <cstddef>
#include <utility>

#include "core/error.h"

namespace layup {

namespace {
// Set once by each worker thread; a thread belongs to at most one pool.
thread_local int this_thread_worker_index = -1;
}  // namespace

int CpuUpdatePool::current_worker() {
  return this_thread_worker_index;
}

CpuUpdatePool::CpuUpdatePool(int worker_count) {
  LAYUP_CHECK(worker_count >= 1, "the CPU update pool needs at least one worker, not ",
              worker_count);
  for (int i = 0; i < worker_count; ++i) workers_.emplace_back([this, i] { work(i); });
}

CpuUpdatePool::~CpuUpdatePool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  task_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void CpuUpdatePool::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(task));
  }
  task_ready_.notify_one();
}

void CpuUpdatePool::submit_urgent(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    queue_.insert(queue_.begin() + static_cast<std::ptrdiff_t>(urgent_), std::move(task));
    ++urgent_;
  }
  task_ready_.notify_one();
}

void CpuUpdatePool::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && running_ == 0; });
  if (first_error_) {
    std::exception_ptr error = std::exchange(first_error_, nullptr);
    std::rethrow_exception(error);
  }
}

void CpuUpdatePool::work(int worker_index) {
  this_thread_worker_index = worker_index;
  std::unique_lock lock(mutex_);
  for (;;) {
    task_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    if (urgent_ > 0) --urgent_;
    ++running_;
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !first_error_) first_error_ = error;
    --running_;
    if (queue_.empty() && running_ == 0) idle_.notify_all();
  }
}

}  // namespace layup
