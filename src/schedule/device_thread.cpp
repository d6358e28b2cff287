// DeviceThread: one worker thread, one piece of work at a time.
#include "schedule/device_thread.h"

#include <omp.h>

#include <utility>

namespace layup {

DeviceThread::DeviceThread()
    : thread_([this, omp_threads = omp_get_max_threads()] {
        omp_set_num_threads(omp_threads);
        loop();
      }) {}

DeviceThread::~DeviceThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void DeviceThread::run(std::function<void()> work) {
  std::unique_lock lock(mutex_);
  work_ = std::move(work);
  error_ = nullptr;
  done_ = false;
  changed_.notify_all();
  changed_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void DeviceThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || work_; });
    if (stopping_) return;
    std::function<void()> work = std::move(work_);
    work_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      work();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    changed_.notify_all();
  }
}

}  // namespace layup
