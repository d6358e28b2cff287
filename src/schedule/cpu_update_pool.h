// A fixed set of threads that run submitted tasks while the submitting thread goes on. The `layup`
// schedule runs two pools of one thread each: the consumer, which hands each block's gradient on
// as the device finishes it (copy out or read in place, give the slot back), and the coordinator,
// which runs each span's update; both hand the data-parallel part of a task to the pinned
// HostAdamW workers, while the device thread goes on with the backward of the next block.
//
// Order: tasks start in submission order, except that an urgent task starts before every
// non-urgent task still waiting (urgent tasks keep their order among themselves): layup's
// coordinator runs the head's updates, which the next forward reads first, ahead of block updates
// still queued.
//
// A task can ask which worker runs it (current_worker), e.g. to put its trace span on that
// worker's track.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace layup {

class CpuUpdatePool {
 public:
  explicit CpuUpdatePool(int worker_count);
  ~CpuUpdatePool();
  CpuUpdatePool(const CpuUpdatePool&) = delete;
  CpuUpdatePool& operator=(const CpuUpdatePool&) = delete;

  int worker_count() const { return static_cast<int>(workers_.size()); }

  // The index (0 .. worker_count-1) of the pool worker calling this, or -1 when the caller is
  // not a pool worker.
  static int current_worker();

  // Queues a task; a free worker takes it (tasks start in submission order).
  void submit(std::function<void()> task);

  // Queues a task ahead of every non-urgent task that has not started, behind earlier urgent ones.
  void submit_urgent(std::function<void()> task);

  // Waits until every submitted task has finished; rethrows the first exception a task threw
  // since the last wait.
  void wait_idle();

 private:
  void work(int worker_index);

  std::mutex mutex_;
  std::condition_variable task_ready_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> queue_;
  size_t urgent_ = 0;  // the first urgent_ tasks of queue_ are the urgent ones
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr first_error_;
  std::vector<std::thread> workers_;
};

}  // namespace layup
