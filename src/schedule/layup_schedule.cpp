// The `layup` mode (the paper's schedule): backward block by block into two gradient slots, each
// slot handed to CPU workers as soon as its block is done, AdamW on the CPU per block.
//
// One step, as in the paper's figure:
//
//   device thread                                  CPU workers (CpuUpdatePool)
//   forward
//   backward_head -> head gradients (stay whole)
//   for l = L-1 .. 0:
//     acquire slot l % 2 (waits for its release)
//     zero it, backward_block(l) into it   ---->   copy the slot to the host, add it to block
//                                                  l's fp32 gradient accumulator, release slot;
//                                                  on the last micro-batch: the block's sum of
//                                                  squares, and (no clipping) AdamW on block l,
//                                                  new weights copied to the device
//   backward_embeddings; head gradients to the host
//
// Gradient clipping by global norm (DESIGN.md, design (a)): the host keeps the whole fp32
// gradient, streamed out of the slots, so the norm is known at the end of backward. With a clip
// threshold the CPU then updates every block (workers in parallel, submitted in forward order)
// and the step waits for all updates before it returns: the update does not yet overlap the next
// step's forward. With no clipping (clip_max_norm <= 0) each block is updated during backward,
// overlapped with the backward of the blocks below it, as in the paper. Embeddings (tied wte:
// LM head and token embedding) and the final norm are updated once, after backward_embeddings.
//
// Every micro-batch's gradient is computed into zeroed memory and added to the host accumulator
// with one float add per element, in micro-batch order, and the norm is the sum of per-span sums
// of squares in layout order: exactly what `gpu` and `offload` compute, so all three modes agree
// bitwise on the CPU backend.
//
// The host state (master weights, accumulated gradient, moments) is HostOptimizerSchedule's.
// Workers touch disjoint spans of it; the pool's mutex orders them with the main thread.
//
// Trace (set_trace): the device thread's "forward", "backward_head", "wait_slot l" (waiting for
// a slot's release), "backward_block l", "backward_embeddings" and "consume head" on the track
// "GPU"; each worker's "consume block l" (copy out, accumulate, release), "adamw block l",
// "adamw embeddings" and "adamw final_norm" on its track "cpu worker i".
//
// Non-finite values: a non-finite loss is known before the last backward, and then nothing is
// updated, as in the other modes. Without clipping, a non-finite gradient is found only block by
// block: a block whose gradient is not finite is not updated, but the other blocks were updated
// during backward and stay updated (the step reports applied = false; `gpu` changes nothing).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/cpu_update_pool.h"
#include "schedule/host_optimizer_schedule.h"
#include "schedule/weight_grad_slots.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// The thread that issues all device work of a step (forward, backward, slot handshakes), so the
// CPU workers overlap with it even when "the device" is the host.
class DeviceThread {
 public:
  // The OpenMP thread count (--threads) is per thread in libgomp: a new std::thread starts with
  // the process default, not the creator's setting, so the device thread adopts the creator's.
  DeviceThread()
      : thread_([this, omp_threads = omp_get_max_threads()] {
          omp_set_num_threads(omp_threads);
          loop();
        }) {}
  ~DeviceThread() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Runs work on the device thread and waits for it; rethrows what it threw.
  void run(std::function<void()> work) {
    std::unique_lock lock(mutex_);
    work_ = std::move(work);
    error_ = nullptr;
    done_ = false;
    changed_.notify_all();
    changed_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
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

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> work_;
  std::exception_ptr error_;
  bool done_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

class LayupSchedule final : public HostOptimizerSchedule {
 public:
  LayupSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                const ParameterLayout& layout, int cpu_workers)
      : HostOptimizerSchedule(std::move(backend), std::move(device), layout),
        embeddings_grad_(device_->allocate(layout.embeddings().count)),
        final_norm_grad_(device_->allocate(layout.final_norm().count)),
        slots_(*device_, layout.block().count),
        head_staging_(std::max(layout.embeddings().count, layout.final_norm().count)),
        span_sum_sq_(layout.spans().size(), 0.0),
        block_updated_(layout.config().n_layer, 0),
        pool_(cpu_workers) {
    for (std::vector<float>& staging : slot_staging_) staging.resize(layout.block().count);
  }

  ~LayupSchedule() override {
    try {
      pool_.wait_idle();
    } catch (...) {
    }
  }

  void set_trace(TraceRecorder* recorder) override {
    Schedule::set_trace(recorder);
    worker_tracks_.clear();
    if (recorder == nullptr) return;
    for (int worker = 0; worker < pool_.worker_count(); ++worker)
      worker_tracks_.push_back(recorder->track("cpu worker " + std::to_string(worker)));
  }

  std::string name() const override { return "layup"; }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    LAYUP_CHECK(!broken_, "the layup schedule failed in an earlier step and cannot continue");
    std::fill(host_grads_.begin(), host_grads_.end(), 0.0f);
    std::fill(span_sum_sq_.begin(), span_sum_sq_.end(), 0.0);
    std::fill(block_updated_.begin(), block_updated_.end(), 0);

    const bool overlap = settings.clip_max_norm <= 0.0f;
    AdamWStep unclipped = settings.adamw;
    unclipped.grad_scale = 1.0f;
    double loss_sum = 0.0;
    try {
      device_thread_.run([&] { device_step(micro_batches, overlap, unclipped, loss_sum); });
      pool_.wait_idle();
    } catch (...) {
      broken_ = true;
      try {
        pool_.wait_idle();
      } catch (...) {
      }
      throw;
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / micro_batches.size());
    span_sum_sq_.front() = sum_of_squares(span_grads(layout_.spans().front()), embeddings_count());
    span_sum_sq_.back() = sum_of_squares(span_grads(layout_.spans().back()), final_norm_count());
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    for (double span_sum : span_sum_sq_) sum_sq += span_sum;
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) return stats;

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    // Blocks in forward order (when clipping; without, they were updated during backward), then
    // the embeddings and the final norm, whose gradients were complete only at the end.
    for (const Span& span : layout_.spans()) {
      if (span.kind == SpanKind::kBlock && overlap) {
        LAYUP_CHECK(block_updated_[span.layer], "block ", span.layer, " missed its update");
        continue;
      }
      pool_.submit([this, span, adamw] { update_span(span, adamw, worker_track()); });
    }
    pool_.wait_idle();
    stats.applied = true;
    return stats;
  }

 private:
  size_t embeddings_count() const { return layout_.embeddings().count; }
  size_t final_norm_count() const { return layout_.final_norm().count; }

  // The trace track of the pool worker calling this (0 when not tracing).
  int worker_track() const {
    const int worker = CpuUpdatePool::current_worker();
    return worker >= 0 && worker < static_cast<int>(worker_tracks_.size()) ? worker_tracks_[worker]
                                                                           : 0;
  }

  // Runs on the device thread: forward and backward of every micro-batch, block gradients
  // through the slots to the workers.
  void device_step(std::span<const TokenBatch> micro_batches, bool overlap,
                   const AdamWStep& unclipped, double& loss_sum) {
    const ParameterPointers params = device_params();
    const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      const bool last = k + 1 == micro_batches.size();
      {
        TraceSpan traced(trace_, device_track_, "forward");
        loss_sum += backend_->forward(params, micro_batches[k]);
      }
      // The mean loss is complete before the last backward: a non-finite one updates nothing.
      const bool update_blocks =
          overlap && last && std::isfinite(static_cast<float>(loss_sum / micro_batches.size()));

      device_->fill_zero(embeddings_grad_.data(), embeddings_grad_.count());
      device_->fill_zero(final_norm_grad_.data(), final_norm_grad_.count());
      {
        TraceSpan traced(trace_, device_track_, "backward_head");
        backend_->backward_head(params, final_norm_grad_.data(), embeddings_grad_.data(),
                                loss_scale);
      }
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer) {
        const SlotLease lease = [&] {
          // How long the device waited for a CPU worker to hand the slot back: the stall the
          // double buffer costs when the CPU side is slower than a block's backward.
          TraceSpan traced(trace_, device_track_, "wait_slot", layer);
          return slots_.acquire(layer);
        }();
        {
          TraceSpan traced(trace_, device_track_, "backward_block", layer);
          device_->fill_zero(lease.data, slots_.block_count());
          backend_->backward_block(layer, params, lease.data);
        }
        pool_.submit([this, lease, last, update_blocks, unclipped] {
          consume_block(lease, last, update_blocks, unclipped);
        });
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_embeddings");
        backend_->backward_embeddings(params, embeddings_grad_.data());
      }
      TraceSpan traced(trace_, device_track_, "consume head");
      add_to_host(embeddings_grad_, layout_.spans().front());
      add_to_host(final_norm_grad_, layout_.spans().back());
    }
  }

  // Device thread: one micro-batch's head gradient into the host accumulator.
  void add_to_host(const DeviceBuffer& grad, const Span& span) {
    device_->copy_to_host(head_staging_.data(), grad.data(), span.count);
    float* accumulated = span_grads(span);
    for (size_t i = 0; i < span.count; ++i) accumulated[i] += head_staging_[i];
  }

  // CPU worker: block lease.layer's micro-batch gradient, in a slot.
  void consume_block(const SlotLease& lease, bool last, bool update, const AdamWStep& adamw) {
    const Span& span = layout_.spans()[1 + lease.layer];
    float* accumulated = span_grads(span);
    {
      TraceSpan traced(trace_, worker_track(), "consume block", lease.layer);
      // The staging buffer belongs to the slot: it is free for the slot's next holder only
      // after release, so the add comes before it. Release even when the copy throws, so the
      // device thread is not left waiting.
      struct Releaser {
        WeightGradSlots& slots;
        const SlotLease& lease;
        ~Releaser() { slots.release(lease); }
      } releaser{slots_, lease};
      float* staging = slot_staging_[lease.slot].data();
      device_->copy_to_host(staging, lease.data, span.count);
      for (size_t i = 0; i < span.count; ++i) accumulated[i] += staging[i];
    }
    if (!last) return;
    const double sum_sq = sum_of_squares(accumulated, span.count);
    span_sum_sq_[1 + lease.layer] = sum_sq;
    if (update && std::isfinite(sum_sq)) {
      update_span(span, adamw, worker_track());
      block_updated_[lease.layer] = 1;
    }
  }

  DeviceBuffer embeddings_grad_, final_norm_grad_;  // head gradients, whole, one micro-batch
  WeightGradSlots slots_;                           // block gradients, two slots
  std::vector<float> slot_staging_[WeightGradSlots::kSlotCount];  // one per slot, owned by the
                                                                  // slot's current holder
  std::vector<float> head_staging_;                               // device thread only
  std::vector<double> span_sum_sq_;  // per span, written by the span's worker
  std::vector<char> block_updated_;  // per block, written by the block's worker
  std::vector<int> worker_tracks_;   // "cpu worker i" in trace_, by worker index
  bool broken_ = false;
  // Last: threads stop (joined in their destructors) before the state they use goes away.
  CpuUpdatePool pool_;
  DeviceThread device_thread_;
};

}  // namespace

std::unique_ptr<Schedule> make_layup_schedule(std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& layout, int cpu_workers) {
  return std::make_unique<LayupSchedule>(std::move(backend), std::move(device), layout,
                                         cpu_workers);
}

}  // namespace layup
