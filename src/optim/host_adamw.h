// HostAdamW: the CPU AdamW engine for the host-side optimizer state, built for memory bandwidth.
//
// AdamW on fp32 master weights moves 28 bytes per parameter (reads p, g, m, v; writes p, m, v)
// for a dozen flops, so on a many-core host it runs at the speed of memory. This engine owns a
// fixed set of worker threads, one per core, each pinned to its core; an update splits every
// tensor into one contiguous share per worker (cut at 64-byte lines, adamw_share) and runs the
// SIMD loop of optim/adamw_simd.h on the shares in parallel (bf16 and 8-bit state: the span is
// split instead, at the state's granule, and each share runs optim/adamw_state.h's loop). Because a
// worker always gets the same share of a tensor, the pages it first touched (for_each_worker_share)
// stay on its NUMA node and in its caches. It counts what it did, so a run can report its AdamW
// rate.
//
// Results are bitwise identical to adamw_update / adamw_update_span: the update is elementwise
// and every level of the loop gives the same bits, so neither the worker count nor the split
// changes anything.
//
// Threading contract:
//  - Any thread may call update, update_span, for_each_worker_share, run_on_workers and the
//    statistics, e.g. a schedule's coordinating thread and its device thread. Calls are
//    serialized: a second caller waits until the first call returns (each call already uses every
//    worker, so overlapping calls would gain nothing).
//  - A call returns when every worker has finished its share; the caller may then read and
//    write the buffers (the hand-back is a release/acquire pair, no further fence needed).
//  - Never call into the engine from inside a for_each_worker_share or run_on_workers task (it
//    would deadlock).
//  - The caller sleeps while the workers run; the workers poll for up to 50 us after a call and
//    then sleep on a condition variable, so an idle engine burns no CPU.
//  - The workers take every core they are given: where another thread must keep a core (the
//    thread that drives the device), leave it out with HostAdamWOptions::cores / workers.
//
// Use, e.g. from a CPU worker of a schedule, block by block:
//   HostAdamW adamw;  // one worker per core, pinned, the best SIMD level
//   adamw.update_span(layout, span, params + span.offset, grads, m + span.offset,
//                     v + span.offset, step);
//   ...
//   log(adamw.report());  // "CPU AdamW: 16 workers (pinned), AVX-512, 3.41 G params/s ..."
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/parameter_layout.h"
#include "optim/adamw.h"
#include "optim/adamw_simd.h"
#include "optim/adamw_state.h"

namespace layup {

// How many cores this process may run on (sched_getaffinity; hardware_concurrency where the kernel
// does not say; at least 1): the default worker count.
int allowed_core_count();

// Throws layup::Error unless 1 <= count <= allowed_core_count(), naming the flag: threads beyond
// the cores this process may use only take turns on them, and thousands fail to start at all.
void check_thread_count(const char* flag, int count);

struct HostAdamWOptions {
  int workers = 0;         // 0: one per core this process may run on (sched_getaffinity)
  bool pin = true;         // pin worker i to core cores[i]
  std::vector<int> cores;  // the cores to pin to, in order (default: the allowed ones, ascending)
  std::optional<AdamWIsa> isa;  // none: default_adamw_isa()
};

class HostAdamW {
 public:
  // Starts the workers. Pinning that fails leaves the worker unpinned and says why in
  // pin_status(); it never throws. A bad worker count or ISA throws layup::Error.
  explicit HostAdamW(const HostAdamWOptions& options = {});
  ~HostAdamW();
  HostAdamW(const HostAdamW&) = delete;
  HostAdamW& operator=(const HostAdamW&) = delete;

  // Called by each worker at the start (started = true) and the end of its share of an update,
  // on that worker's thread, e.g. to trace each worker's span. It must not throw or block.
  using ShareHook = std::function<void(int worker, bool started)>;

  // AdamW on one span whose buffers start at the span's first element (as adamw_update_span);
  // weight decay per tensor as the layout says. `on_share`, when set, sees each worker's share.
  void update_span(const ParameterLayout& layout, const Span& span, float* params,
                   const float* grads, float* m, float* v, const AdamWStep& step,
                   const ShareHook& on_share = {});
  // The same, reading and writing the state where `buffers` say (the span's first element each):
  // in place, or out of place into outputs that overlap no input (AdamWBuffers).
  void update_span(const ParameterLayout& layout, const Span& span, const AdamWBuffers& buffers,
                   const AdamWStep& step, const ShareHook& on_share = {});

  // The same with the moments in any optimizer state kind (optim/adamw_state.h): fp32 as above;
  // bf16 and 8-bit state split the span (not each tensor) into one share per worker, cut at the
  // kind's granule (adamw_state_share), so that no 8-bit block is split between workers.
  void update_span(const ParameterLayout& layout, const Span& span,
                   const AdamWStateBuffers& buffers, const AdamWStep& step,
                   const ShareHook& on_share = {});

  // The same on elements [first, first + count) of the span (a rank's part, ZeRO-1), `buffers`
  // starting at the part's first element; bitwise what update_span gives those elements. In bf16
  // and 8-bit state the part must pass check_state_part.
  void update_span_part(const ParameterLayout& layout, const Span& span, size_t first, size_t count,
                        const AdamWBuffers& buffers, const AdamWStep& step,
                        const ShareHook& on_share = {});
  void update_span_part(const ParameterLayout& layout, const Span& span, size_t first, size_t count,
                        const AdamWStateBuffers& buffers, const AdamWStep& step,
                        const ShareHook& on_share = {});

  // AdamW on `count` contiguous parameters (as adamw_update).
  void update(float* params, const float* grads, float* m, float* v, size_t count,
              const AdamWStep& step, bool decay);
  // The same where `buffers` say: in place, or out of place (AdamWBuffers).
  void update(const AdamWBuffers& buffers, size_t count, const AdamWStep& step, bool decay);
  // The same with the moments in any optimizer state kind.
  void update(const AdamWStateBuffers& buffers, size_t count, const AdamWStep& step, bool decay);

  // Runs task(begin, end) on every worker with the share of [0, count) that update() would give
  // it, in parallel, and returns when all are done. Touching a new buffer this way first puts
  // each page on the NUMA node of the worker that will update it. Not counted in the statistics.
  void for_each_worker_share(size_t count, const std::function<void(size_t, size_t)>& task);

  // Runs task(worker, worker_count()) once on every worker (worker = 0 .. worker_count()-1), in
  // parallel, and returns when all are done; rethrows the first exception a task threw. For other
  // data-parallel work of the same threads that needs its own split (e.g. whole chunks of a sum
  // of squares). Not counted in the statistics.
  void run_on_workers(const std::function<void(int, int)>& task);

  int worker_count() const { return static_cast<int>(threads_.size()); }
  AdamWIsa isa() const { return isa_; }
  bool pinned() const { return pinned_; }  // every worker is pinned to its own core
  // "pinned to cores 0-15", "not pinned (pinning turned off)" or what went wrong.
  const std::string& pin_status() const { return pin_status_; }

  // Statistics over every update and update_span call since construction (or the last reset):
  // calls, parameters updated, and wall-clock seconds from entering a call to its return.
  int64_t updates() const;
  int64_t params_updated() const;
  double seconds() const;
  double rate_params_per_s() const;  // 0 before the first update
  void reset_statistics();
  // One line, e.g. "CPU AdamW: 16 workers (pinned), AVX-512, 3.41 G params/s over 120 updates".
  std::string report() const;

 private:
  // One tensor of the current job.
  struct TensorJob {
    AdamWBuffers buffers;
    size_t count;
    bool decay;
  };

  void pin_workers(const HostAdamWOptions& options);
  // Publishes the job in tensors_ (or state_job_, or task_) to the workers and waits until all
  // are done.
  void run_job();
  void work(int index);
  void run_share(int index);
  void count_update(size_t params, double seconds);

  AdamWIsa isa_;
  AdamWKernel kernel_;
  bool pinned_ = false;
  std::string pin_status_;

  // The current job, written by the caller before it bumps generation_, read by the workers
  // after they see the new generation: an update (tensors_), or a task (task_) run by each worker.
  std::vector<TensorJob> tensors_;
  // Or one run of bf16 or 8-bit state, shared out whole (adamw_state_share).
  struct StateJob {
    AdamWStateBuffers buffers;
    size_t count;
    AdamWStateKernel kernel;
    std::vector<DecayRun> decay;
  };
  std::optional<StateJob> state_job_;
  AdamWConstants with_decay_{}, without_decay_{};
  const std::function<void(int, int)>* task_ = nullptr;
  const ShareHook* share_hook_ = nullptr;  // update_span's on_share, or null

  mutable std::mutex call_mutex_;  // serializes callers; also guards the statistics
  int64_t updates_ = 0;
  int64_t params_updated_ = 0;
  double seconds_ = 0.0;

  // Hand-off: the caller bumps generation_ (under mutex_, so a sleeping worker cannot miss it);
  // each worker decrements remaining_ when its share is done, and the last one wakes the caller.
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
  std::exception_ptr first_error_;  // what a run_on_workers task threw; guarded by mutex_

  std::vector<std::thread> threads_;
};

}  // namespace layup
