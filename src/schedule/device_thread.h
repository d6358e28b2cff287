// DeviceThread: the one thread that issues a layup step's device work (forward, backward, slot
// handshakes, the device's AdamW), so that the CPU side overlaps it even when "the device" is the
// host (the CPU backend).
//
// Memory ordering: run() hands the work over and takes its end back under one mutex, so what the
// caller wrote before run() happens before the work, and what the work wrote happens before run()
// returns.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace layup {

class DeviceThread {
 public:
  // The thread adopts the creator's OpenMP thread count (--threads): libgomp keeps it per thread,
  // and a new std::thread starts with the process default.
  DeviceThread();
  ~DeviceThread();
  DeviceThread(const DeviceThread&) = delete;
  DeviceThread& operator=(const DeviceThread&) = delete;

  // Runs `work` on the device thread and waits for it; rethrows what it threw. One caller at a
  // time.
  void run(std::function<void()> work);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> work_;
  std::exception_ptr error_;
  bool done_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace layup
