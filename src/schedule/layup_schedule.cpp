// The `layup` mode (the paper's schedule): backward block by block into two gradient slots, each
// slot handed to the CPU as soon as its block is done, AdamW on the CPU per block.
//
// Threads. The device thread issues all device work (forward, backward, slot handshakes). Two CPU
// threads (CpuUpdatePools of one) take the CPU side's tasks in order: the consumer takes each
// gradient as the device finishes it (wait for its fence, copy it out, release the slot, add it to
// the accumulator), the coordinator each span's update (AdamW, new weights sent back). Both run the
// data-parallel part of their tasks on the pinned HostAdamW workers, so every pass uses all
// --cpu-workers cores (HostAdamW serializes the passes). Two threads, because a consume spends most
// of its time waiting for the device to finish the block: meanwhile the coordinator updates the
// blocks already consumed.
//
// One step, as in the paper's figure:
//
//   device thread                                  consumer, coordinator (+ HostAdamW workers)
//   forward (block l waits for block l's update
//            of the last step, if still landing)
//   backward_head -> head gradients (stay whole)
//   for l = L-1 .. 0:
//     acquire slot l % 2 (waits for its release)
//     zero it, backward_block(l) into it,
//     (one micro-batch) its sum of squares
//     fence                                ---->   once the fence has passed, copy the slot out
//                                                  (one transfer), release the slot, add it to
//                                                  block l's fp32 gradient accumulator; on the
//                                                  last micro-batch: the block's sum of squares
//                                                  (the device's, or the host's of the sum of
//                                                  several), and (--clip none) AdamW on block l,
//                                                  its new weights sent to the device
//                                                  (asynchronously: the next update starts
//                                                  meanwhile)
//   backward_embeddings, fence             ---->   head gradients to the host (the consumer);
//                                                  with one micro-batch the head's sums of
//                                                  squares (the device's) are reported first,
//                                                  so the norm is known before the embeddings'
//                                                  gradient (the largest span) has landed
//                                                  (head_on_device: only the sums, of the
//                                                  device's sum over micro-batches where there
//                                                  are several; the head stays on the device
//                                                  and step() has the device update it, below)
//
// Gradient clipping by global norm: the host keeps the whole fp32 gradient, streamed out of the
// slots, so the global norm is known at the end of backward. Deferred (DESIGN.md, design (a)):
// with a clip threshold, step() then submits every span's update in the order the next forward
// reads the spans (embeddings, blocks 0 .. L-1, final norm) and returns: the updates run while
// the next forward runs, and the forward waits, span by span, only for the update of the span it
// is about to read (ForwardHooks, model_backend.h). With one micro-batch the norm is known
// before the head's gradient has landed: step() submits the blocks' updates at once, and the
// head's (embeddings, final norm) go ahead of the blocks still queued as soon as their gradient
// is on the host (HeadUpdate), so the workers never wait for that landing. Speculative (design
// (b), ScheduleOptions::speculative_clip, the trainer's default): each block is updated during
// backward as if the step were not clipped, reading the current state and writing the spare one; at
// the end of backward a step that is not clipped keeps those updates, a clipped one submits the
// blocks' updates again, from the current state into the spare one, with the clip factor (deferred,
// as above); either way every span's new state is in the spare copy, which becomes the current one.
// A block consumed once the blocks' running norm already exceeds the threshold is not speculated
// on, and after a clipped step the next one is deferred outright (clipping comes in runs); a step
// whose norm is not finite changes nothing (the device copy of the speculated blocks is restored).
// With no clipping (clip_max_norm <= 0) each block is updated in place during backward, overlapped
// with the backward of the blocks below it, as in the paper. Embeddings (tied wte: LM head and
// token embedding) and the final norm are updated once, after backward_embeddings, and may
// likewise still be landing when the step returns.
//
// The head on the device (ScheduleOptions::head_on_device, a discrete GPU's default): the
// embeddings' and the final norm's gradient never leaves device memory. Their sums of squares are
// the device's, as with one micro-batch above, and once step() knows the clip factor the device
// thread issues their AdamW (Device::adamw_update_span) on the device copy of their weights, with
// moments of their own in device memory, in the device's order after the backward and before the
// next forward: no transfer either way, no CPU time at the end of the step, and the next forward
// waits for nothing at the embeddings. With several micro-batches the device sums their head
// gradients in a buffer of its own (zeroed, then each added in micro-batch order, as the gpu
// schedule sums its gradient), and the sums of squares and the update read that sum. On the CPU
// backend the same update runs on the device thread, bitwise what the CPU workers compute
// (HostAdamW matches adamw_update_span).
//
// Without a host gradient (ScheduleOptions::host_gradient = false: --clip none and one micro-batch,
// what a unified-memory device wants) there is no accumulator: the consumer takes block l's
// gradient where it lies (in the slot where the host can read device memory, after the fence; else
// copied into the slot's pinned landing buffer, releasing the slot at once) and hands its AdamW to
// the coordinator, which gives the memory back once it has read it: an in-place slot to the
// device (for block l-2's backward), a landing buffer to the consumer (for block l-2's copy), so
// on a discrete GPU the copy of one block runs beside the AdamW of the one before. The head's
// gradients are read the same way by the updates step() submits.
//
// Updates in flight after step() returns are tracked per span (CpuProgress): an update has
// landed when its new weights are in the device copy. A forward (the next step's, evaluate,
// forward_logits) waits for each span's update in its hook; export_tensors, import_tensors,
// set_trace and the destructor wait for all.
//
// On CUDA (backend/device.h): the fence after a block's backward lets its slot be copied out while
// the next block's backward runs; the copies go to pinned host memory, gradients out and weights
// in on two copy streams of their own. A forward's wait is on the host: the device thread issues
// block l's forward once block l's weights have landed, while the GPU still runs the work issued
// before it. The next step needs no wait of its
// own: it reads the host state only after its first forward, which has waited for every span, and
// it overwrites the gradient accumulator of a span (first micro-batch: 0 + g) only after that.
//
// Every micro-batch's gradient is computed on its own (the backward overwrites the memory it is
// given, so slots need no zeroing) and added to the host accumulator with one float add per
// element, in micro-batch order, and the norm is the sum of per-span sums of squares in layout
// order: exactly what `gpu` and `offload` compute, so all three modes agree bitwise on the CPU
// backend. Only the timing of the updates differs.
//
// Trace (set_trace): the device thread's "forward" (inside it "forward embeddings", "forward
// block l", "forward head", and "wait_update ..." where a forward waited for an update),
// "backward_head", "wait_slot l" (waiting for a slot's release), "backward_block l" and
// "backward_embeddings" on the track "GPU"; the consumer's "consume block l" and "consume head"
// (wait for the fence, copy out, release, accumulate) on the track "gradients to host"; the
// coordinator's "adamw block l", "adamw embeddings" and "adamw final_norm" (each run by all
// HostAdamW workers together) on the track "cpu workers"; each span's new weights in transfer
// ("weights block l", ...) on the track "to device".
//
// Non-finite values: a non-finite loss is known before the last backward, and then nothing is
// updated, as in the other modes; with clipping, a non-finite gradient norm updates nothing
// either. Without clipping, a non-finite gradient is found only block by block, after the blocks
// above it were updated: a block whose own gradient is not finite is not updated, nor are the
// embeddings and the final norm, but every block whose own gradient was finite was updated during
// backward and stays updated (the step reports applied = false; `gpu` changes nothing). Undoing
// them exactly would need a copy of every block's weights and moments (12 bytes per parameter of
// host memory and traffic on every step) for a step the trainer does not survive anyway (it stops
// at the first non-finite step, keeping the last checkpoint).
#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/cpu_progress.h"
#include "schedule/cpu_update_pool.h"
#include "schedule/device_thread.h"
#include "schedule/host_optimizer_schedule.h"
#include "schedule/release_once.h"
#include "schedule/weight_grad_slots.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

class LayupSchedule final : public HostOptimizerSchedule {
 public:
  LayupSchedule(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                const ParameterLayout& layout, const ScheduleOptions& options)
      : HostOptimizerSchedule(std::move(backend), std::move(device), layout, options),
        grads_kind_(options.kind_of(TensorClass::kWeightGrads, device_->memory_kind())),
        grads_in_place_(!host_gradient_ && grads_kind_ != MemoryKind::kDevice),
        head_on_device_(options.head_on_device),
        embeddings_grad_(allocate_grads(layout.embeddings().count)),
        final_norm_grad_(allocate_grads(layout.final_norm().count)),
        slots_(*device_, layout.block().count, grads_kind_),
        span_sum_sq_(layout.spans().size(), 0.0),
        block_update_submitted_(layout.config().n_layer, 0),
        progress_(layout.spans().size()) {
    LAYUP_CHECK(host_gradient_ || !speculative_clip_,
                "speculative clipping needs the whole-model gradient on the host (it may redo "
                "every block's update once the norm is known)");
    LAYUP_CHECK(!head_on_device_ || !weights_in_place_,
                "updating the head on the device needs the device's own copy of the weights (the "
                "device computes with the master weights in place here)");
    const size_t head_count = head_floats();
    if (!host_gradient_ && !grads_in_place_) {
      for (DeviceBuffer& landing : slot_landing_)
        landing = device_->allocate_host(layout.block().count, TensorClass::kWeightGrads);
      if (!head_on_device_)
        head_landing_ = device_->allocate_host(head_count, TensorClass::kWeightGrads);
    }
    if (head_on_device_) {
      head_m_ = device_->allocate(head_count, TensorClass::kOptimizerMoments);
      head_v_ = device_->allocate(head_count, TensorClass::kOptimizerMoments);
    }
  }

  ~LayupSchedule() override { wait_for_coordinator(); }

  void set_trace(TraceRecorder* recorder) override {
    // Updates of the last step may still be running, and they read trace_.
    wait_for_coordinator();
    HostOptimizerSchedule::set_trace(recorder);
    cpu_track_ = recorder != nullptr ? recorder->track("cpu workers") : 0;
    consumer_track_ = recorder != nullptr ? recorder->track("gradients to host") : 0;
  }

  std::string name() const override { return "layup"; }

  // With head_on_device the head's weights and moments are the device's; the host's spans of
  // them are unused.
  OptimizerTensors export_tensors() const override {
    OptimizerTensors tensors = HostOptimizerSchedule::export_tensors();
    if (!head_on_device_) return tensors;
    for (const size_t index : head_spans()) {
      const Span& span = layout_.spans()[index];
      const size_t at = head_offset(index);
      device_->copy_to_host(tensors.params.data() + span.offset, params_.data() + span.offset,
                            span.count);
      device_->copy_to_host(tensors.adam_m.data() + span.offset, head_m_.data() + at, span.count);
      device_->copy_to_host(tensors.adam_v.data() + span.offset, head_v_.data() + at, span.count);
    }
    return tensors;
  }

  void import_tensors(const OptimizerTensors& tensors) override {
    HostOptimizerSchedule::import_tensors(tensors);  // the weights: the device copy, whole
    if (!head_on_device_) return;
    for (const size_t index : head_spans()) {
      const Span& span = layout_.spans()[index];
      const size_t at = head_offset(index);
      device_->copy_to_device(head_m_.data() + at, tensors.adam_m.data() + span.offset, span.count);
      device_->copy_to_device(head_v_.data() + at, tensors.adam_v.data() + span.offset, span.count);
    }
  }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    LAYUP_CHECK(!broken_, "the layup schedule failed in an earlier step and cannot continue");
    LAYUP_CHECK(host_gradient_ || (settings.clip_max_norm <= 0.0f && micro_batches.size() == 1),
                "this layup schedule keeps no whole-model gradient on the host (planned for "
                "--clip none and one micro-batch, as a unified-memory device wants), so it cannot "
                "clip (asked: ",
                settings.clip_max_norm, ") or accumulate (asked: ", micro_batches.size(),
                " micro-batches); plan the run with clipping or --grad-accum to keep one");
    // With the head on the device and several micro-batches the device sums the head's gradient
    // in head_sum_ (allocated at the first step that needs it; the memory plan counts it for
    // --grad-accum > 1). head_summed_ changes only where the head is on the device: the consumer
    // of the other paths may still be landing the last step's head gradient here.
    if (head_on_device_) head_summed_ = micro_batches.size() > 1;
    if (head_summed_ && head_sum_.count() == 0) head_sum_ = allocate_grads(head_floats());
    // None is touched by an update that may still be in flight from the last step.
    std::fill(span_sum_sq_.begin(), span_sum_sq_.end(), 0.0);
    std::fill(block_update_submitted_.begin(), block_update_submitted_.end(), 0);
    speculated_sum_sq_ = 0.0;

    // Blocks are updated during backward without clipping, or speculatively (as if the step were
    // not clipped, into the spare state) with it, unless the last step was clipped: clipping
    // comes in runs (the first steps of a run, loss spikes), and a speculation that fails costs
    // host bandwidth the other updates need.
    const bool speculative =
        speculative_clip_ && settings.clip_max_norm > 0.0f && !last_step_clipped_;
    const bool overlap = settings.clip_max_norm <= 0.0f || speculative;
    // Where this step's updates read the state and write the new one; a speculative step promotes
    // the spare state once every span's update is submitted.
    step_from_ = current_state();
    step_to_ = speculative ? spare_state() : step_from_;
    // Past this sum of squares (of the blocks consumed so far) the step is clipped for certain,
    // and further blocks are not updated speculatively. A margin keeps rounding away from that
    // decision; it only saves work, the final check decides.
    const double max_norm = settings.clip_max_norm;
    speculation_limit_sq_ =
        speculative ? 1.0001 * max_norm * max_norm : std::numeric_limits<double>::infinity();
    AdamWStep unclipped = settings.adamw;
    unclipped.grad_scale = 1.0f;
    // One micro-batch with a host gradient: the norm is known once the device has taken the
    // head's sums of squares, before its gradient (the embeddings': the largest span) has landed,
    // so the block updates start meanwhile and the head's follow its landing.
    const std::shared_ptr<HeadUpdate> head =
        host_gradient_ != nullptr && micro_batches.size() == 1 && !head_on_device_
            ? std::make_shared<HeadUpdate>()
            : nullptr;
    double loss_sum = 0.0;
    try {
      device_thread_.run([&] { device_step(micro_batches, overlap, unclipped, head, loss_sum); });
      progress_.wait_consumed();
    } catch (...) {
      broken_ = true;
      wait_for_coordinator();
      throw;
    }

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / micro_batches.size());
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    for (double span_sum : span_sum_sq_) sum_sq += span_sum;
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
      if (head != nullptr) decide_head_update(*head, nullptr);
      if (speculative) undo_speculative_updates();
      last_step_clipped_ = true;
      return stats;
    }

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    last_step_clipped_ = stats.clip_factor < 1.0f;
    // A speculative update of a block used factor 1: exact when the step is not clipped; else
    // the block is updated again, from the same state, with the factor.
    const bool speculation_holds = adamw.grad_scale == 1.0f;
    // In layout order, which is the order the next forward reads the spans: embeddings (its first
    // op), blocks 0 .. L-1 (those not updated during backward), final norm. The step returns
    // without waiting: the next forward waits span by span. A block's update submitted again runs
    // after its speculative one (the coordinator runs tasks in order), and a forward waits for
    // both to land.
    const std::vector<Span>& spans = layout_.spans();
    for (size_t index = 0; index < spans.size(); ++index) {
      // The head's update is decided below (HeadUpdate), or runs on the device.
      if ((head != nullptr || head_on_device_) && spans[index].kind != SpanKind::kBlock) continue;
      if (spans[index].kind == SpanKind::kBlock && block_update_submitted_[spans[index].layer]) {
        if (!speculative || speculation_holds) continue;
        stats.blocks_redone += 1;
      } else {
        LAYUP_CHECK(spans[index].kind != SpanKind::kBlock || speculative || !overlap, "block ",
                    spans[index].layer, " missed its update");
        if (spans[index].kind == SpanKind::kBlock && speculative) stats.blocks_deferred += 1;
      }
      submit_update(index, gradient_of_span(index), adamw);
    }
    if (head != nullptr) decide_head_update(*head, &adamw);
    // Issued after the blocks' updates are queued: on CUDA it returns at once and runs before the
    // next forward in the device's order; on the CPU backend it runs here.
    if (head_on_device_) device_thread_.run([&] { update_head_on_device(adamw); });
    if (speculative) promote_spare_state();
    stats.applied = true;
    return stats;
  }

 protected:
  float forward_pass(const TokenBatch& batch) override {
    LayupForwardHooks hooks(*this);
    const float loss = backend_->forward(device_params(), batch, hooks);
    hooks.finish();
    return loss;
  }

  void finish_updates() const override { progress_.wait_all_landed(); }

 private:
  // The hooks of every forward: before a span's weights are read, wait until the span's update
  // has landed in the device copy. With a trace, records each span's forward ("forward
  // embeddings", "forward block l", "forward head", from the end of its wait to the next hook or
  // the end of the forward) and every wait that was needed ("wait_update ...") on the device track.
  class LayupForwardHooks final : public ForwardHooks {
   public:
    explicit LayupForwardHooks(const LayupSchedule& schedule)
        : schedule_(schedule),
          trace_(schedule.trace_ != nullptr && schedule.trace_->recording() ? schedule.trace_
                                                                            : nullptr),
          track_(schedule.device_track_) {}

    void before_embeddings() override { enter(0, "embeddings", "embeddings", -1); }
    void before_block(int layer) override { enter(1 + layer, "block", "block", layer); }
    void before_head() override {
      enter(schedule_.layout_.spans().size() - 1, "head", "final_norm", -1);
    }
    // Ends the last span's record; call when the forward has returned.
    void finish() { close(); }

   private:
    // "<what> <part>", with " <layer>" for a block.
    static std::string span_name(const char* what, const char* part, int layer) {
      std::string name = what;
      name += ' ';
      name += part;
      if (layer >= 0) {
        name += ' ';
        name += std::to_string(layer);
      }
      return name;
    }

    // What the forward reads next: span `span`, recorded as "forward <part>[ layer]"; a wait for
    // its update as "wait_update <update>[ layer]".
    void enter(size_t span, const char* part, const char* update, int layer) {
      close();
      const double wait_start_us = trace_ != nullptr ? trace_->now_us() : 0.0;
      const bool waited = schedule_.progress_.wait_landed(span);
      if (trace_ == nullptr) return;
      open_part_ = part;
      open_layer_ = layer;
      open_start_us_ = trace_->now_us();
      if (waited)
        trace_->add_span(track_, span_name("wait_update", update, layer), wait_start_us,
                         open_start_us_);
    }
    void close() {
      if (trace_ == nullptr || open_part_ == nullptr) return;
      trace_->add_span(track_, span_name("forward", open_part_, open_layer_), open_start_us_,
                       trace_->now_us());
      open_part_ = nullptr;
    }

    const LayupSchedule& schedule_;
    TraceRecorder* const trace_;  // null: not recording
    const int track_;
    const char* open_part_ = nullptr;  // the span whose forward is running (null before the first)
    int open_layer_ = -1;
    double open_start_us_ = 0.0;
  };

  // The head spans' updates of a step whose norm is known before the head's gradient has landed on
  // the host (one micro-batch with a host gradient: the device took the head's sums of squares).
  // step() decides (the AdamW step, or no update), the consume that lands the gradient reports the
  // landing; whichever comes second submits the updates. Guarded by `mutex`.
  struct HeadUpdate {
    std::mutex mutex;
    bool decided = false, landed = false;
    bool update = false;  // decided: whether the head spans are updated
    AdamWStep adamw{};
    // The states the step's updates read and write (step() may have moved on to the next step's
    // by the time the gradient lands).
    OptimizerState from{}, to{};
  };

  // The head's spans: the embeddings (the first in layout order) and the final norm (the last).
  std::array<size_t, 2> head_spans() const { return {0, layout_.spans().size() - 1}; }

  // Consumer: the head spans' sums of squares, the device's (the fence after them has passed).
  void take_head_sums() {
    for (const size_t index : head_spans()) span_sum_sq_[index] = device_sum_of_squares(index);
  }

  // step(): the head spans are updated with `adamw` (null: not updated). Counted as submitted
  // before step() returns, so that the next forward waits for them.
  void decide_head_update(HeadUpdate& head, const AdamWStep* adamw) {
    if (adamw != nullptr)
      for (const size_t index : head_spans()) progress_.update_submitted(index);
    bool submit = false;
    {
      std::lock_guard lock(head.mutex);
      head.decided = true;
      head.update = adamw != nullptr;
      if (adamw != nullptr) {
        head.adamw = *adamw;
        head.from = step_from_;
        head.to = step_to_;
      }
      submit = head.update && head.landed;
    }
    if (submit) submit_head_updates(head);
  }

  // Consumer: the head's gradient is on the host.
  void head_gradient_landed(HeadUpdate& head) {
    bool submit = false;
    {
      std::lock_guard lock(head.mutex);
      head.landed = true;
      submit = head.decided && head.update;
    }
    if (submit) submit_head_updates(head);
  }

  // The head spans' updates (counted by decide_head_update), ahead of the block updates still
  // queued: the next forward reads the embeddings first, and the block updates submitted before
  // them kept the workers busy while the head's gradient was landing.
  void submit_head_updates(const HeadUpdate& head) {
    for (const size_t index : head_spans())
      coordinator_.submit_urgent(
          [this, index, grads = gradient_of_span(index), adamw = head.adamw, from = head.from,
           to = head.to] { run_task([&] { run_update(index, grads, from, to, adamw); }); });
  }

  // Runs a coordinator task; a failure is kept in progress_, so that nobody waits forever for
  // what the task would have reported, and rethrown to the pool.
  template <class Task>
  void run_task(Task&& task) {
    try {
      task();
    } catch (...) {
      progress_.fail(std::current_exception());
      throw;
    }
  }

  // Waits until the coordinator is idle and the transfers it started have landed; a task's
  // failure stays in progress_ (the next wait on it throws) and makes the schedule unusable.
  void wait_for_coordinator() {
    try {
      consumer_.wait_idle();  // first: a consume may submit an update
      coordinator_.wait_idle();
    } catch (...) {
      broken_ = true;
    }
    progress_.wait_transfers_landed();
  }

  // Where the update of span `index` reads its gradient once the backward is done: the host
  // accumulator, or (without host_gradient) a head span's gradient where it lies (blocks are
  // updated by their consume, from their slot).
  const float* gradient_of_span(size_t index) const {
    const Span& span = layout_.spans()[index];
    if (host_gradient_) return host_gradient_->span(index);
    LAYUP_CHECK(span.kind != SpanKind::kBlock,
                "a block without a host gradient is updated from its slot");
    if (grads_in_place_) return micro_batch_head_gradient(index);  // one micro-batch
    return head_landing_.data() + head_offset(index);
  }

  // A speculative step whose norm is not finite changes nothing: the current state was left
  // alone, and the device copy of every block updated speculatively is refreshed from it once
  // those updates have landed.
  void undo_speculative_updates() {
    progress_.wait_all_landed();
    for (int layer = 0; layer < layout_.config().n_layer; ++layer)
      if (block_update_submitted_[layer]) refresh_device_weights(layout_.spans()[1 + layer]);
  }

  // Hands span `index`'s update (from step_from_ into step_to_) to the coordinator; it counts as
  // in flight until it has landed. `read_done` (when given) runs once its AdamW has read `grads`.
  void submit_update(size_t index, const float* grads, const AdamWStep& adamw,
                     std::shared_ptr<ReleaseOnce> read_done = nullptr) {
    progress_.update_submitted(index);
    coordinator_.submit([this, index, grads, adamw, from = step_from_, to = step_to_, read_done] {
      run_task([&] { run_update(index, grads, from, to, adamw); });
      if (read_done) read_done->now();
    });
  }

  // AdamW on span `index` from `grads` on the calling thread, its landing reported to progress_.
  // update_span's trace span ends before the landing is reported, so a forward that waited for
  // it starts after it in the trace too.
  void run_update(size_t index, const float* grads, const OptimizerState& from,
                  const OptimizerState& to, const AdamWStep& adamw) {
    progress_.transfer_starting();
    try {
      update_span(layout_.spans()[index], grads, from, to, adamw, cpu_track_,
                  [this, index] { progress_.update_landed(index); });
    } catch (...) {
      progress_.transfer_abandoned();
      throw;
    }
  }

  // Runs on the device thread: forward and backward of every micro-batch, block gradients
  // through the slots to the coordinator.
  // `head` (one micro-batch with a host gradient, else null): the head's sums of squares are
  // reported as soon as the device has taken them, and its gradient lands after, into `head`.
  void device_step(std::span<const TokenBatch> micro_batches, bool overlap,
                   const AdamWStep& unclipped, const std::shared_ptr<HeadUpdate>& head,
                   double& loss_sum) {
    const ParameterPointers params = device_params();
    const float loss_scale = 1.0f / static_cast<float>(micro_batches.size());
    for (size_t k = 0; k < micro_batches.size(); ++k) {
      const bool first = k == 0;
      const bool last = k + 1 == micro_batches.size();
      {
        TraceSpan traced(trace_, device_track_, "forward");
        loss_sum += forward_pass(micro_batches[k]);
      }
      // The mean loss is complete before the last backward: a non-finite one updates nothing.
      const bool update_blocks =
          overlap && last && std::isfinite(static_cast<float>(loss_sum / micro_batches.size()));

      // The consumer must be done with the last micro-batch's (or step's) head gradients before
      // the head overwrites them with this one's (the backward overwrites: ModelBackend).
      if (!first) progress_.wait_consumed();
      progress_.wait_head_landed();
      {
        TraceSpan traced(trace_, device_track_, "backward_head");
        backend_->backward_head(params, final_norm_grad_.data(), embeddings_grad_.data(),
                                loss_scale);
      }
      for (int layer = layout_.config().n_layer - 1; layer >= 0; --layer) {
        const SlotLease lease = [&] {
          // How long the device waited for the coordinator to hand the slot back: the stall the
          // double buffer costs when the CPU side is slower than a block's backward.
          TraceSpan traced(trace_, device_track_, "wait_slot", layer);
          return slots_.acquire(layer);
        }();
        {
          TraceSpan traced(trace_, device_track_, "backward_block", layer);
          backend_->backward_block(layer, params, lease.data);  // overwrites the slot
          // One micro-batch: the norm's share is taken where the gradient lies.
          if (first && last) start_device_sum_of_squares(1 + layer, lease.data);
        }
        std::shared_ptr<const DeviceFence> written = device_->fence();
        progress_.consume_submitted();
        consumer_.submit([this, lease, written, first, last, update_blocks, unclipped] {
          run_task([&] {
            consume_block(lease, *written, first, last, update_blocks, unclipped);
            progress_.consume_done();
          });
        });
      }
      {
        TraceSpan traced(trace_, device_track_, "backward_embeddings");
        backend_->backward_embeddings(params, embeddings_grad_.data());
        if (head_summed_) {
          if (first) device_->fill_zero(head_sum_.data(), head_sum_.count());
          for (const size_t index : head_spans())
            device_->add(device_head_gradient(index), micro_batch_head_gradient(index),
                         layout_.spans()[index].count);
        }
        // One micro-batch, or the device's sum of them: the head's sums of squares are the
        // device's.
        if (last && (first || head_summed_))
          for (const size_t index : head_spans())
            start_device_sum_of_squares(index, device_head_gradient(index));
      }
      std::shared_ptr<const DeviceFence> written = device_->fence();
      progress_.consume_submitted();
      if (head != nullptr) {
        progress_.head_landing_submitted();
        consumer_.submit([this, written, head] {
          run_task([&] {
            TraceSpan traced(trace_, consumer_track_, "consume head");
            land_head_gradient(*written, *head);
          });
        });
      } else {
        consumer_.submit([this, written, first, last] {
          run_task([&] {
            TraceSpan traced(trace_, consumer_track_, "consume head");
            if (host_gradient_ != nullptr && !head_on_device_) {
              for (const size_t index : head_spans())
                span_sum_sq_[index] = host_gradient_->accumulate(
                    *written, micro_batch_head_gradient(index), index, first, last);
            } else if (last) {
              // (head_summed_: before the last micro-batch the device's sum is not complete, and
              // nothing on the host reads it.)
              take_head_gradient(*written);
            }
            progress_.consume_done();
          });
        });
      }
    }
  }

  // Consumer: block lease.layer's micro-batch gradient, in a slot, complete once `written`
  // has passed.
  // Hands a slot back to the device once, at release() or when it goes (even when a copy throws,
  // so the device thread is not left waiting).
  struct SlotReleaser {
    WeightGradSlots& slots;
    const SlotLease& lease;
    bool released = false;
    void release() {
      if (released) return;
      released = true;
      slots.release(lease);
    }
    ~SlotReleaser() { release(); }
  };

  void consume_block(const SlotLease& lease, const DeviceFence& written, bool first, bool last,
                     bool update, const AdamWStep& adamw) {
    if (!host_gradient_) {
      update_block_from_slot(lease, written, update, adamw);
      return;
    }
    const size_t index = 1 + lease.layer;
    double sum_sq = 0.0;
    {
      TraceSpan traced(trace_, consumer_track_, "consume block", lease.layer);
      // The slot is free for the device as soon as its contents are out of device memory.
      SlotReleaser releaser{slots_, lease};
      sum_sq = host_gradient_->accumulate(written, lease.data, index, first, last,
                                          [&releaser] { releaser.release(); });
    }
    if (!last) return;
    span_sum_sq_[index] = sum_sq;
    speculated_sum_sq_ += sum_sq;
    if (update && std::isfinite(sum_sq) && speculated_sum_sq_ <= speculation_limit_sq_) {
      // Registered before this consume reports done, so the step sees it.
      block_update_submitted_[lease.layer] = 1;
      submit_update(index, host_gradient_->span(index), adamw);
    }
  }

  // Consumer, without host_gradient (one micro-batch, no clipping): block lease.layer's gradient
  // where it lies (in the slot, where the host can read it, else copied into the slot's landing
  // buffer, which frees the slot), its sum of squares (the device's), and its update handed to
  // the coordinator, so that the next block's copy runs while this block's AdamW does. The memory
  // the AdamW reads goes back once it has been read: an in-place slot to the device, a landing
  // buffer to this consumer, which copies block l-2's gradient into it.
  void update_block_from_slot(const SlotLease& lease, const DeviceFence& written, bool update,
                              const AdamWStep& adamw) {
    const size_t index = 1 + lease.layer;
    const Span& span = layout_.spans()[index];
    const float* grads = lease.data;
    std::shared_ptr<ReleaseOnce> read_done;
    {
      TraceSpan traced(trace_, consumer_track_, "consume block", lease.layer);
      if (grads_in_place_) {
        read_done = std::make_shared<ReleaseOnce>([this, lease] { slots_.release(lease); });
        device_->wait_for(written);
      } else {
        acquire_landing(lease.slot);  // block l+2's AdamW has read it
        read_done =
            std::make_shared<ReleaseOnce>([this, slot = lease.slot] { release_landing(slot); });
        SlotReleaser releaser{slots_, lease};
        float* landing = slot_landing_[lease.slot].data();
        device_->copy_to_host_after(written, landing, lease.data, span.count);
        releaser.release();
        grads = landing;
      }
      span_sum_sq_[index] = device_sum_of_squares(index);  // the fence has passed
    }
    if (update && std::isfinite(span_sum_sq_[index])) {
      block_update_submitted_[lease.layer] = 1;
      submit_update(index, grads, adamw, std::move(read_done));
    }
  }

  // The landing buffer of a slot, for the consumer's copy: waits until no update reads it.
  void acquire_landing(int slot) {
    std::unique_lock lock(landing_mutex_);
    landing_freed_.wait(lock, [&] { return !landing_busy_[slot]; });
    landing_busy_[slot] = true;
  }
  void release_landing(int slot) {
    {
      std::lock_guard lock(landing_mutex_);
      landing_busy_[slot] = false;
    }
    landing_freed_.notify_all();
  }

  // Consumer, one micro-batch with host_gradient: the head's sums of squares (the device's) once
  // the fence has passed, reported at once (the step's norm needs nothing more), then its
  // gradient copied into the accumulator, where `head`'s updates read it.
  void land_head_gradient(const DeviceFence& written, HeadUpdate& head) {
    device_->wait_for(written);
    take_head_sums();
    progress_.consume_done();
    for (const size_t index : head_spans())
      host_gradient_->land(written, micro_batch_head_gradient(index), index);
    progress_.head_landed();
    head_gradient_landed(head);
  }

  // Consumer, without host_gradient or with head_on_device: the head spans' gradients where the
  // updates will read them (gradient_of_span; head_on_device: where the backward left them), and
  // their sums of squares (the device's).
  void take_head_gradient(const DeviceFence& written) {
    if (grads_in_place_ || head_on_device_) {
      device_->wait_for(written);
    } else {
      for (const size_t index : head_spans())
        device_->copy_to_host_after(written, head_landing_.data() + head_offset(index),
                                    micro_batch_head_gradient(index), layout_.spans()[index].count);
    }
    take_head_sums();
  }

  // Device thread, head_on_device: AdamW on the head spans in the device copy of their weights,
  // from their gradient where the backward left it, after all the work issued so far (the step's
  // backward) and before the next forward; the forward casts them into its compute copy as usual.
  void update_head_on_device(const AdamWStep& adamw) {
    for (const size_t index : head_spans()) {
      const Span& span = layout_.spans()[index];
      TraceSpan traced(trace_, device_track_, adamw_trace_name(span.kind), span.layer);
      const size_t at = head_offset(index);
      device_->adamw_update_span(layout_, span, params_.data() + span.offset,
                                 device_head_gradient(index), head_m_.data() + at,
                                 head_v_.data() + at, adamw, nullptr);
    }
  }

  // head_on_device: the device-side gradient of head span `index` this step: one micro-batch's, as
  // backward_head and backward_embeddings leave it, or with head_summed_ the device's sum over
  // micro-batches. Read on the device thread, which step() starts after setting head_summed_.
  float* device_head_gradient(size_t index) const {
    return head_summed_ ? head_sum_.data() + head_offset(index) : micro_batch_head_gradient(index);
  }
  // Where the backward leaves one micro-batch's gradient of head span `index`: the embeddings' or
  // the final norm's.
  float* micro_batch_head_gradient(size_t index) const {
    return index == 0 ? embeddings_grad_.data() : final_norm_grad_.data();
  }

  // The head's buffers (head_m_, head_v_, head_sum_, head_landing_) hold both head spans, the
  // embeddings then the final norm: head_floats() floats, span `index` from head_offset(index).
  size_t head_floats() const { return layout_.embeddings().count + layout_.final_norm().count; }
  size_t head_offset(size_t index) const { return index == 0 ? 0 : layout_.embeddings().count; }

  // Device-side weight gradients (slots, head) in memory of grads_kind_ (the placement's).
  DeviceBuffer allocate_grads(size_t count) {
    return device_->allocate_kind(count, TensorClass::kWeightGrads, MemorySide::kDevice,
                                  grads_kind_);
  }

  const MemoryKind grads_kind_;
  // Without host_gradient, where the host reads the gradients: in place (memory the host can
  // read: the CPU backend's, or gradients placed in pinned or managed memory on CUDA, which the
  // GPU then writes over the interconnect), or in pinned landing buffers (one per slot, one for
  // both head spans).
  const bool grads_in_place_;
  std::array<DeviceBuffer, WeightGradSlots::kSlotCount> slot_landing_;
  // Whether an update still reads a slot's landing buffer (acquire_landing, release_landing).
  std::mutex landing_mutex_;
  std::condition_variable landing_freed_;
  std::array<bool, WeightGradSlots::kSlotCount> landing_busy_{};
  // ScheduleOptions::head_on_device: the head spans' AdamW moments, in device memory
  // (head_offset), their weights the device copy's.
  const bool head_on_device_;
  DeviceBuffer head_m_, head_v_;
  DeviceBuffer head_landing_;
  DeviceBuffer embeddings_grad_, final_norm_grad_;  // head gradients, whole, one micro-batch
  // head_on_device with several micro-batches (head_summed_, set by step() before the device
  // starts): the head's gradient summed over them, laid out as head_m_ (head_offset).
  bool head_summed_ = false;
  DeviceBuffer head_sum_;
  WeightGradSlots slots_;  // block gradients, two slots
  // Per span, the sum of squares of its gradient: written by the consumer, read by step() after
  // wait_consumed.
  std::vector<double> span_sum_sq_;
  std::vector<char> block_update_submitted_;  // per block, this step; written by the consumer
  // This step's: where its updates read and write the state (set before the device starts), the
  // sum of squares of the blocks consumed so far and the bound past which blocks are no longer
  // updated speculatively (the consumer's).
  OptimizerState step_from_{}, step_to_{};
  double speculated_sum_sq_ = 0.0;
  double speculation_limit_sq_ = 0.0;
  bool last_step_clipped_ = false;  // speculation waits for a step that is not clipped
  int cpu_track_ = 0;               // "cpu workers" in trace_
  int consumer_track_ = 0;          // "gradients to host" in trace_
  bool broken_ = false;
  CpuProgress progress_;
  // Last: threads stop (joined in their destructors) before the state they use goes away.
  CpuUpdatePool coordinator_{1};
  CpuUpdatePool consumer_{1};  // after the coordinator: it submits to it, so it stops first
  DeviceThread device_thread_;
};

}  // namespace

std::unique_ptr<Schedule> make_layup_schedule(std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& layout,
                                              const ScheduleOptions& options) {
  return std::make_unique<LayupSchedule>(std::move(backend), std::move(device), layout, options);
}

}  // namespace layup
