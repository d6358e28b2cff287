// HostAdamW: pinned worker threads, the generation-counter hand-off, and the rate statistics.
#include "optim/host_adamw.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace layup {

namespace {

using Clock = std::chrono::steady_clock;

// How long a worker keeps polling for the next job before it sleeps, and how long a caller polls
// for the end of a job. A schedule hands over spans back to back, often within microseconds;
// sleeping and being woken costs a futex round trip each way, so a short poll saves that without
// burning a core while the engine is idle.
constexpr auto kWorkerSpin = std::chrono::microseconds(50);
constexpr auto kCallerSpin = std::chrono::microseconds(5);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` until it holds or `limit` has passed; returns whether it held.
template <class Done>
bool spin_until(Done done, Clock::duration limit) {
  const Clock::time_point end = Clock::now() + limit;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (Clock::now() >= end) return done();
  }
}

// The cores this process may run on, ascending; empty if the kernel would not say.
std::vector<int> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cores;
  for (int core = 0; core < CPU_SETSIZE; ++core)
    if (CPU_ISSET(core, &set)) cores.push_back(core);
  return cores;
}

// "0-3,8,10-11".
std::string format_cores(const std::vector<int>& cores) {
  std::string text;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!text.empty()) text += ",";
    text += std::to_string(cores[i]);
    if (j > i) text += "-" + std::to_string(cores[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace

int allowed_core_count() {
  int cores = static_cast<int>(allowed_cores().size());
  if (cores == 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return cores > 0 ? cores : 1;
}

void check_thread_count(const char* flag, int count) {
  const int cores = allowed_core_count();
  LAYUP_CHECK(count >= 1 && count <= cores, flag, " ", count, " is not between 1 and the ", cores,
              " cores this process may run on; give at most ", cores,
              " (or leave the flag out for one per core)");
}

HostAdamW::HostAdamW(const HostAdamWOptions& options)
    : isa_(options.isa ? *options.isa : default_adamw_isa()), kernel_(adamw_kernel(isa_)) {
  LAYUP_CHECK(options.workers >= 0, "the CPU AdamW needs a positive number of workers, not ",
              options.workers);
  const int workers = options.workers == 0 ? allowed_core_count() : options.workers;
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { work(i); });
  pin_workers(options);
}

HostAdamW::~HostAdamW() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void HostAdamW::pin_workers(const HostAdamWOptions& options) {
  for (size_t i = 0; i < threads_.size(); ++i) {
    const std::string name = "layup-adamw-" + std::to_string(i);
    pthread_setname_np(threads_[i].native_handle(), name.substr(0, 15).c_str());
  }
  if (!options.pin) {
    pin_status_ = "not pinned (pinning turned off)";
    return;
  }
  const std::vector<int> allowed = allowed_cores();
  const std::vector<int> cores = options.cores.empty() ? allowed : options.cores;
  if (cores.empty()) {
    pin_status_ = "not pinned: the kernel did not say which cores this process may use";
    return;
  }
  std::string failure;
  std::vector<int> used;
  for (size_t i = 0; i < threads_.size(); ++i) {
    // More workers than cores: deal them out round robin (each core then runs several).
    const int core = cores[i % cores.size()];
    if (core < 0 || core >= CPU_SETSIZE) {
      failure = "core " + std::to_string(core) + " is outside 0-" + std::to_string(CPU_SETSIZE - 1);
      break;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    const int error = pthread_setaffinity_np(threads_[i].native_handle(), sizeof set, &set);
    if (error != 0) {
      failure = "pinning worker " + std::to_string(i) + " to core " + std::to_string(core) +
                " failed (" + std::strerror(error) + ")";
      break;
    }
    used.push_back(core);
  }
  if (failure.empty()) {
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    pinned_ = used.size() == threads_.size();  // each worker on a core of its own
    pin_status_ = "pinned to cores " + format_cores(used);
    if (!pinned_) pin_status_ += " (more workers than cores: several share a core)";
    return;
  }
  // Half-pinned workers would balance worse than none: give every worker the whole process mask
  // back (best effort) and go on unpinned.
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int core : allowed) CPU_SET(core, &all);
  if (!allowed.empty())
    for (std::thread& thread : threads_)
      pthread_setaffinity_np(thread.native_handle(), sizeof all, &all);
  pin_status_ = "not pinned: " + failure + "; the workers run unpinned";
}

void HostAdamW::update_span(const ParameterLayout& layout, const Span& span, float* params,
                            const float* grads, float* m, float* v, const AdamWStep& step,
                            const ShareHook& on_share) {
  update_span(layout, span, AdamWBuffers::in_place(params, grads, m, v), step, on_share);
}

void HostAdamW::update_span(const ParameterLayout& layout, const Span& span,
                            const AdamWBuffers& buffers, const AdamWStep& step,
                            const ShareHook& on_share) {
  update_span_part(layout, span, 0, span.count, buffers, step, on_share);
}

void HostAdamW::update_span(const ParameterLayout& layout, const Span& span,
                            const AdamWStateBuffers& buffers, const AdamWStep& step,
                            const ShareHook& on_share) {
  update_span_part(layout, span, 0, span.count, buffers, step, on_share);
}

void HostAdamW::update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                                 size_t count, const AdamWBuffers& buffers, const AdamWStep& step,
                                 const ShareHook& on_share) {
  std::lock_guard call(call_mutex_);
  const Clock::time_point start = Clock::now();
  tensors_.clear();
  size_t total = 0;
  for (const TensorSpec& tensor : layout.tensors_in(span)) {
    const size_t begin = std::max(first, tensor.offset_in_span);
    const size_t stop = std::min(first + count, tensor.offset_in_span + tensor.count);
    if (begin >= stop) continue;
    tensors_.push_back({buffers.at(begin - first), stop - begin, tensor.weight_decay});
    total += stop - begin;
  }
  with_decay_ = adamw_constants(step, true);
  without_decay_ = adamw_constants(step, false);
  task_ = nullptr;
  share_hook_ = on_share ? &on_share : nullptr;
  if (total > 0) run_job();
  share_hook_ = nullptr;
  count_update(total, std::chrono::duration<double>(Clock::now() - start).count());
}

void HostAdamW::update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                                 size_t count, const AdamWStateBuffers& buffers,
                                 const AdamWStep& step, const ShareHook& on_share) {
  if (buffers.kind() == OptimizerStateKind::kFp32) {
    update_span_part(layout, span, first, count, buffers.fp32(), step, on_share);
    return;
  }
  check_state_part(buffers.kind(), span, first, count);
  const AdamWStateKernel kernel = adamw_state_kernel(buffers.kind(), isa_);
  std::lock_guard call(call_mutex_);
  const Clock::time_point start = Clock::now();
  tensors_.clear();
  state_job_ = StateJob{buffers, count, kernel, decay_runs(layout, span, first, count)};
  with_decay_ = adamw_constants(step, true);
  task_ = nullptr;
  share_hook_ = on_share ? &on_share : nullptr;
  if (count > 0) run_job();
  share_hook_ = nullptr;
  state_job_.reset();
  count_update(count, std::chrono::duration<double>(Clock::now() - start).count());
}

void HostAdamW::update(float* params, const float* grads, float* m, float* v, size_t count,
                       const AdamWStep& step, bool decay) {
  update(AdamWBuffers::in_place(params, grads, m, v), count, step, decay);
}

void HostAdamW::update(const AdamWBuffers& buffers, size_t count, const AdamWStep& step,
                       bool decay) {
  std::lock_guard call(call_mutex_);
  const Clock::time_point start = Clock::now();
  tensors_.assign(1, {buffers, count, decay});
  with_decay_ = adamw_constants(step, true);
  without_decay_ = adamw_constants(step, false);
  task_ = nullptr;
  if (count > 0) run_job();
  count_update(count, std::chrono::duration<double>(Clock::now() - start).count());
}

void HostAdamW::update(const AdamWStateBuffers& buffers, size_t count, const AdamWStep& step,
                       bool decay) {
  if (buffers.kind() == OptimizerStateKind::kFp32) {
    update(buffers.fp32(), count, step, decay);
    return;
  }
  const AdamWStateKernel kernel = adamw_state_kernel(buffers.kind(), isa_);
  std::lock_guard call(call_mutex_);
  const Clock::time_point start = Clock::now();
  tensors_.clear();
  state_job_ = StateJob{buffers, count, kernel, {DecayRun{count, decay}}};
  with_decay_ = adamw_constants(step, true);
  task_ = nullptr;
  if (count > 0) run_job();
  state_job_.reset();
  count_update(count, std::chrono::duration<double>(Clock::now() - start).count());
}

void HostAdamW::for_each_worker_share(size_t count,
                                      const std::function<void(size_t, size_t)>& task) {
  run_on_workers([&](int worker, int workers) {
    const ElementRange share = adamw_share(count, worker, workers);
    if (share.end > share.begin) task(share.begin, share.end);
  });
}

void HostAdamW::run_on_workers(const std::function<void(int, int)>& task) {
  std::lock_guard call(call_mutex_);
  tensors_.clear();
  task_ = &task;
  run_job();
  task_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = std::exchange(first_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void HostAdamW::run_job() {
  remaining_.store(worker_count(), std::memory_order_relaxed);
  {
    // Under the mutex so that a worker between checking the generation and going to sleep
    // cannot miss the new one. The release publishes the job (tensors_, constants, task_).
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_ready_.notify_all();
  // The acquire pairs with each worker's release in fetch_sub: their writes to the buffers are
  // visible to the caller once remaining_ reads 0.
  const auto all_done = [this] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (spin_until(all_done, kCallerSpin)) return;
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, all_done);
}

void HostAdamW::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto new_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(new_job, kWorkerSpin)) {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, new_job);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load(std::memory_order_relaxed)) return;  // published before the generation
    run_share(index);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the mutex orders this wake-up after a caller that has checked remaining_ under it
      // and is about to sleep.
      std::lock_guard lock(mutex_);
      work_done_.notify_one();
    }
  }
}

void HostAdamW::run_share(int index) {
  const int workers = worker_count();
  if (task_ != nullptr) {
    try {
      (*task_)(index, workers);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
    return;
  }
  if (share_hook_ != nullptr) (*share_hook_)(index, true);
  if (state_job_) {
    const StateJob& job = *state_job_;
    const ElementRange share = adamw_state_share(job.buffers.kind(), job.count, index, workers);
    if (share.end > share.begin)
      job.kernel(job.buffers, share.begin, share.end, with_decay_, job.decay);
  }
  for (const TensorJob& tensor : tensors_) {
    const ElementRange share = adamw_share(tensor.count, index, workers);
    if (share.end == share.begin) continue;
    kernel_(tensor.buffers.at(share.begin), share.end - share.begin,
            tensor.decay ? with_decay_ : without_decay_);
  }
  if (share_hook_ != nullptr) (*share_hook_)(index, false);
}

void HostAdamW::count_update(size_t params, double seconds) {
  ++updates_;
  params_updated_ += static_cast<int64_t>(params);
  seconds_ += seconds;
}

int64_t HostAdamW::updates() const {
  std::lock_guard call(call_mutex_);
  return updates_;
}

int64_t HostAdamW::params_updated() const {
  std::lock_guard call(call_mutex_);
  return params_updated_;
}

double HostAdamW::seconds() const {
  std::lock_guard call(call_mutex_);
  return seconds_;
}

double HostAdamW::rate_params_per_s() const {
  std::lock_guard call(call_mutex_);
  return seconds_ > 0.0 ? static_cast<double>(params_updated_) / seconds_ : 0.0;
}

void HostAdamW::reset_statistics() {
  std::lock_guard call(call_mutex_);
  updates_ = 0;
  params_updated_ = 0;
  seconds_ = 0.0;
}

std::string HostAdamW::report() const {
  const double rate = rate_params_per_s();
  const int64_t calls = updates();
  char head[120], tail[80];
  std::snprintf(head, sizeof head, "CPU AdamW: %d worker%s (%s), %s", worker_count(),
                worker_count() == 1 ? "" : "s", pinned_ ? "pinned" : "not pinned",
                adamw_isa_name(isa_));
  if (calls == 0) {
    std::snprintf(tail, sizeof tail, ", no updates yet");
  } else {
    std::snprintf(tail, sizeof tail, ", %.2f G params/s over %lld update%s", rate / 1e9,
                  static_cast<long long>(calls), calls == 1 ? "" : "s");
  }
  return std::string(head) + tail;
}

}  // namespace layup
