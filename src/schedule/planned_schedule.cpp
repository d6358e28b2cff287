// The executor of every mode's plan: `layup` (the paper's schedule), `offload` (its baseline: the
// same tasks with every gradient copied after the whole backward, updated after the norm, the step
// returning once the weights have landed) and `gpu` (every span updated on the device from the
// whole-model gradient, nothing on the host). It composes HostUpdatedModel, MicroBatchGradients
// (slots, or the whole-model gradient) and three policies chosen once from ScheduleOptions (the
// full semantics: docs/schedules.md):
//
//   GradientRoute  where a host-updated span's gradient goes: the host accumulator, a landing
//                  buffer, or read in place (gradient_route.h); none where no span is
//   UpdateTiming   when a host-updated block is updated: during backward (no clipping), once the
//                  norm is known (deferred), or speculatively (update_timing.h)
//   DeviceTier     the spans update_sites places on the device (gpu: every span), updated by the
//                  device's AdamW once the norm is known, their moments split across the ranks
//                  with ZeRO-1 (device_tier.h); every other span is updated on the CPU
//
// The device thread runs the device lane of the step's plan (step_plan.h, compiled once per
// micro-batch count and clipping) and hands each gradient on where the plan copies it; the
// consumer and the coordinator run the host's tasks as the device hands them gradients. One layup
// step, as in the paper's figure:
//
//   device thread                                consumer, coordinator (+ HostAdamW workers)
//   forward (each span waits for its update of
//            the last step, if still landing)
//   backward_head -> head gradients (stay whole)
//   for l = L-1 .. 0:
//     backward_block(l) into slot l % 2 (a
//       device-updated block: into its own
//       gradient), fence                  ---->  the route hands the slot's gradient on and gives
//                                                the slot back; on the last micro-batch its sum of
//                                                squares, and the timing's AdamW on block l now
//   backward_embeddings, fence            ---->  the head's sums of squares, then its gradient on
//                                                its route
//   step(): the norm, the clip factor; the updates the timing left, the head's (HeadUpdate), and
//   the device tier's AdamW in the device's order before the next forward.
//
// Threads: the device thread (DeviceThread) issues all device work; the consumer and the
// coordinator (CpuUpdatePools of one thread each) hand gradients on and run updates, every pass on
// the pinned HostAdamW workers; the weight ring's thread fills the streamed blocks' slots as the
// device thread starts the plan's "weights in" tasks (StepFills); CpuProgress tells each who is
// done. gpu mode on one rank has no CPU side: its device lane and its one consume run on the
// calling thread.
// Updates may still be landing
// when step() returns: a forward waits span by span (ForwardWaits); export_tensors,
// import_tensors, set_trace and the destructor wait for all. Trace tracks and span names, and what
// a non-finite step leaves: docs/schedules.md. With several ranks, MPI is called by one thread at a
// time: the consumer during the step (the sums over the ranks, the plan's ranks lane: a host span's
// as it lands, a device-updated span's as the device thread hands it over at the end of its last
// backward, each while the device computes the spans below), then step() itself (the loss; with
// ZeRO-1 of the host's state, every host span's update and the gather of its weights), then the
// device thread (the device tier's update). Every rank runs the lane in its plan's order, so the
// collectives pair up.
//
// Every micro-batch's gradient is summed with one float add per element in micro-batch order,
// and the norm is the sum of per-span sums of squares in layout order: what `gpu` and `offload`
// compute, so all modes and every placement agree bitwise on the CPU backend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/grad_norm.h"
#include "schedule/cpu_progress.h"
#include "schedule/cpu_update_pool.h"
#include "schedule/device_thread.h"
#include "schedule/device_tier.h"
#include "schedule/forward_waits.h"
#include "schedule/gradient_route.h"
#include "schedule/host_updated_model.h"
#include "schedule/layer_major_buffers.h"
#include "schedule/micro_batch_gradients.h"
#include "schedule/mode_schedules.h"
#include "schedule/release_once.h"
#include "schedule/staged_tier.h"
#include "schedule/step_plan.h"
#include "schedule/update_timing.h"
#include "schedule/weight_grad_slots.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// The options a mode's schedule runs with: offload brings every span's whole gradient to the host
// and updates every span there, once the norm is known; gpu updates every span on the device, from
// the gradient summed there, and keeps nothing on the host.
ScheduleOptions mode_options(Mode mode, const ParameterLayout& layout, ScheduleOptions options) {
  if (mode == Mode::kOffload) {
    options.host_gradient = true;
    options.speculative_clip = false;
    // Every span on the host, except the blocks staged through the device.
    for (UpdateSite& site : options.update_sites)
      if (site != UpdateSite::kStaged) site = UpdateSite::kHost;
    if (!StagedTier::any(options)) options.update_sites.clear();
    options.weights_land_in_compute_copy = false;
  }
  // ZeRO-1 of the host's state updates every host span once the norm is known (the thread that
  // runs the update gathers its weights): speculative clipping's early updates would have no one
  // to gather them, and deferred clipping gives the same bits.
  if (HostUpdatedModel::host_shards(layout, options)) options.speculative_clip = false;
  if (mode == Mode::kGpu) {
    options.host_gradient = false;
    options.speculative_clip = false;
    options.weights_in_place = false;
    options.weights_land_in_compute_copy = false;
    options.update_sites.assign(layout.spans().size(), UpdateSite::kDevice);
    options.accumulation = Accumulation::kMicroBatchMajor;  // its sums are on the device anyway
    LAYUP_CHECK(options.streamed_blocks == 0,
                "gpu mode updates every block on the device, in place: it has no host copy of "
                "the weights to stream from; use --streamed-blocks 0, or offload or layup");
  }
  return options;
}

// Whether the mode's backward writes the whole-model gradient (gpu, offload) rather than slots.
bool whole_gradient(Mode mode) {
  return mode != Mode::kLayup;
}

// Whether the CPU updates any span (the host's or the disk's).
bool cpu_updates(const ParameterLayout& layout, const ScheduleOptions& options) {
  return HostUpdatedModel::cpu_spans(layout, options).count > 0;
}

class PlannedSchedule final : public Schedule {
 public:
  PlannedSchedule(Mode mode, std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                  const ParameterLayout& layout, const ScheduleOptions& options)
      : mode_(mode),
        layout_(layout),
        options_(mode_options(mode, layout, options)),
        model_(std::move(backend), std::move(device), layout, options_, mode == Mode::kGpu),
        grads_kind_(gradients_kind(options_, model_.device().kinds())),
        gradients_(model_.device(), layout, whole_gradient(mode), grads_kind_),
        device_tier_(model_.device(), layout_, options_, gradients_, grads_kind_,
                     device_moments_kind(mode, options_, model_.device().kinds())),
        host_head_spans_(host_updated_head_spans(layout, options_.update_sites)),
        route_(cpu_updates(layout, options_)
                   ? make_gradient_route(options_.host_gradient ? model_.host_gradient() : nullptr,
                                         model_.device(), layout_, grads_kind_,
                                         block_route_head_spans(options_, host_head_spans_))
                   : nullptr),
        head_route_(head_accumulator_only(options_) && model_.host_gradient() != nullptr
                        ? make_gradient_route(model_.host_gradient(), model_.device(), layout_,
                                              grads_kind_, {})
                        : nullptr),
        timing_(options_.speculative_clip),
        layer_major_(model_.device(), layout_, whole_gradient(mode), grads_kind_,
                     model_.device().kinds().host_copy,
                     hidden_states_kind(options_, model_.device().kinds())),
        span_sum_sq_(layout.spans().size(), 0.0),
        block_updated_(layout.config().n_layer, 0),
        steps_on_caller_(mode == Mode::kGpu && model_.ranks() == nullptr),
        progress_(layout.spans().size()) {
    head_routed_.resize(layout.spans().size());
    LAYUP_CHECK(options_.host_gradient || !model_.speculative_clip(),
                "speculative clipping needs the whole-model gradient on the host (it may redo "
                "every block's update once the norm is known)");
    // The device-updated spans' gradients are summed over the ranks where they are (ZeRO-1: by
    // the device tier, into each rank's part).
    if (model_.ranks() != nullptr && !device_tier_.spans().empty() && !device_tier_.sharded())
      collectives_ = join_device_collectives(model_.device(), *model_.ranks());
    LAYUP_CHECK(device_tier_.spans().empty() || !model_.weights_in_place(),
                "updating spans on the device (the head, or blocks) needs the device's own copy of "
                "the weights, and here the device computes with the master weights in place; "
                "update those spans on the host, or keep the weights in device memory");
    if (!device_tier_.spans().empty()) {
      device_tier_weights_.assign(layout.spans().size(), nullptr);
      // Where weights land in the compute copy, or every span is updated on the device, the
      // device's AdamW writes the compute copies too.
      if (model_.weights_land_in_compute_copy() || !cpu_updates(layout, options_))
        device_tier_compute_copies_.assign(layout.spans().size(), nullptr);
      for (const size_t index : device_tier_.spans()) {
        device_tier_weights_[index] = model_.device_copy() + model_.device_copy_at(index);
        if (!device_tier_compute_copies_.empty())
          device_tier_compute_copies_[index] = model_.backend().compute_copy(index);
      }
    }
  }

  ~PlannedSchedule() override { wait_for_cpu_side(); }

  std::string name() const override { return name_of(mode_); }
  OptimizerStateKind optimizer_state() const override { return options_.optimizer_state; }

  const ParameterLayout& layout() const override { return layout_; }

  void set_trace(TraceRecorder* recorder) override {
    wait_for_cpu_side();  // updates of the last step may still be running, and they read trace_
    trace_ = recorder;
    device_track_ = device_track(recorder);
    model_.set_trace(recorder);
    cpu_track_ = recorder != nullptr ? recorder->track("cpu workers") : 0;
    staging_track_ =
        recorder != nullptr && StagedTier::any(options_) ? recorder->track("staging") : 0;
    consumer_track_ = recorder != nullptr ? recorder->track("gradients to host") : 0;
    ranks_track_ = recorder != nullptr && model_.ranks() != nullptr ? recorder->track("ranks") : 0;
  }

  float evaluate(const TokenBatch& batch) override { return forward_pass(batch, fill_now()); }
  const float* forward_logits(const TokenBatch& batch) override {
    forward_pass(batch, fill_now());
    return model_.backend().logits();
  }

  // The device-updated spans' weights and moments are the device's.
  void export_span(size_t index, const SpanState& out) const override {
    finish_updates();
    if (!device_tier_.holds(index)) return model_.export_span(index, out);
    device_tier_.read_span(index, out, model_.device_copy() + model_.device_copy_at(index));
  }
  void import_span(size_t index, const ConstSpanState& in) override {
    finish_updates();
    // The forward casts the new weights, unless they land in the compute copy.
    if (!model_.weights_land_in_compute_copy()) model_.backend().set_compute_copies_current(false);
    model_.import_span(index, in);  // host state, and the weights to the device
    if (device_tier_.holds(index)) device_tier_.write_span(index, in);
  }
  // ZeRO-1: rank 0's export asks the owners for their parts of the moments, the device tier's or
  // the host's, until it ends the exchange.
  void serve_exports() override {
    if (!sharded() || model_.ranks()->rank() == 0) return;
    for (;;) {
      uint64_t request[4];  // kEndExports, or kSendMoments of span request[1]
      model_.ranks()->receive(request, 4, 0);
      if (request[0] == kEndExports) return;
      const size_t index = request[1];
      if (device_tier_.holds(index))
        device_tier_.send_moments(index);
      else
        model_.send_moments(index);
    }
  }
  void end_exports() override {
    if (!sharded()) return;
    const uint64_t end[4] = {kEndExports, 0, 0, 0};
    for (int r = 1; r < model_.rank_count(); ++r) model_.ranks()->send(end, 4, r);
  }
  std::string cpu_adamw_report() const override {
    finish_updates();  // count every update of the steps so far
    return model_.cpu_adamw_report();
  }
  double cpu_adamw_rate() const override {
    finish_updates();
    return model_.cpu_adamw_rate();
  }
  std::string storage_report() const override { return model_.storage_report(); }
  DiskTraffic disk_traffic() const override { return model_.disk_traffic(); }

  StepStats step(std::span<const TokenBatch> micro_batches,
                 const UpdateSettings& settings) override {
    check_step(micro_batches, settings.clip_max_norm);
    const StepPlan& step_plan = plan_for(micro_batches.size(), settings.clip_max_norm > 0.0f);
    const StepContext context = begin_step(step_plan, settings);
    double loss_sum = 0.0;
    try {
      on_device_lane([&] { device_step(micro_batches, step_plan, context, loss_sum); });
      progress_.wait_consumed();
      // Where the plan's norm waits for the head's gradient on the host (the host sums it), the
      // head's update is decided with its gradient there.
      if (norm_waits_for_head(step_plan)) progress_.wait_head_landed();
    } catch (...) {
      broken_ = true;
      wait_for_cpu_side();
      throw;
    }
    // The consumer has summed every span's gradient over the ranks: MPI is this thread's again.
    if (model_.ranks() != nullptr) loss_sum = model_.ranks()->sum_in_rank_order(loss_sum);

    StepStats stats;
    stats.loss = static_cast<float>(loss_sum / global_micro_batches(micro_batches.size()));
    // Per-span sums added in layout order: the fixed order every mode uses.
    double sum_sq = 0.0;
    for (const double span_sum : span_sum_sq_) sum_sq += span_sum;
    stats.grad_norm = std::sqrt(sum_sq);
    if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
      abandon_step(context);
      return stats;
    }

    AdamWStep adamw = settings.adamw;
    adamw.grad_scale = stats.clip_factor = clip_factor(stats.grad_norm, settings.clip_max_norm);
    const bool clipped = stats.clip_factor < 1.0f;
    timing_.end_step(clipped);
    // The step returns without waiting for these (the next forward waits span by span), except
    // with ZeRO-1 of the host's state, whose updates run here.
    if (model_.sharded()) {
      update_host_parts(adamw);
    } else {
      if (context.head != nullptr) decide_head_update(*context.head, context, &adamw);
      submit_block_updates(context, adamw, clipped, stats);
    }
    // After the blocks' updates are queued: on CUDA it returns at once and runs before the next
    // forward in the device's order; on the CPU backend it runs here.
    if (!device_tier_.spans().empty())
      on_device_lane([&] {
        const bool copies_written = device_tier_.update(
            adamw, device_tier_weights_, device_tier_compute_copies_, trace_, device_track_);
        // Where the update wrote every span's compute copy, the next forward skips its cast (with
        // weights landing there, the copies are always current).
        if (!model_.weights_land_in_compute_copy())
          model_.backend().set_compute_copies_current(copies_written);
      });
    if (context.timing->speculative()) model_.promote_spare_state();
    if (step_plan.weights_before_return) finish_updates();
    stats.applied = true;
    return stats;
  }

 private:
  // A forward pass on the device copy, waiting span by span for updates still landing, and
  // running `before_span` before each span's weights are read (the streamed blocks' fills).
  float forward_pass(const TokenBatch& batch, std::function<void(size_t span)> before_span) {
    ForwardWaits waits(progress_, layout_.spans().size() - 1, trace_, device_track_,
                       std::move(before_span));
    const float loss = model_.backend().forward(model_.device_params(), batch, waits);
    waits.finish();
    return loss;
  }

  // A forward outside a step (evaluate, forward_logits): each streamed block filled into its slot
  // just before it is read, on the calling thread.
  std::function<void(size_t span)> fill_now() {
    if (model_.weight_ring() == nullptr) return {};
    return [this](size_t span) {
      if (model_.streams(span)) model_.weight_ring()->fill_now(span, model_.stream_source(span));
    };
  }

  // Device thread, one step: the plan's "weights in" tasks (the to-device lane's fills of the
  // streamed blocks' ring slots), each started on the ring's thread once the device has run the
  // task it waits for (the slot's last reader), in the lane's order, and waited for by the device
  // task that reads it. A fill waits there for the block's update of the last step to have landed
  // on the host. Its destructor waits for the fills it started (a step that failed leaves none
  // running).
  class StepFills {
   public:
    StepFills(const StepPlan& plan, HostUpdatedModel& model, const CpuProgress& progress,
              TraceRecorder* trace, int track)
        : plan_(plan), model_(model), progress_(progress), trace_(trace), track_(track) {
      for (size_t t = 0; t < plan.tasks.size(); ++t)
        if (plan.tasks[t].kind == TaskKind::kWeightsIn) fills_.push_back(static_cast<int>(t));
    }
    StepFills(const StepFills&) = delete;
    StepFills& operator=(const StepFills&) = delete;
    ~StepFills() {
      for (const auto& [fill, filled] : started_) filled.wait();
    }

    // Before device task `task` runs: every task before it in the plan's device lane has run.
    void before(int task) {
      for (; next_ < fills_.size(); ++next_) {
        const int fill = fills_[next_];
        const std::vector<int>& after = plan_.tasks[fill].after;
        if (std::any_of(after.begin(), after.end(), [&](int t) { return t >= task; })) break;
        const size_t span = static_cast<size_t>(plan_.tasks[fill].span);
        // The slot's last reader is issued: the copy waits on the device for it to be done.
        started_[fill] = model_.weight_ring()->fill_async(
            span, model_.stream_source(span), model_.device().fence(),
            [this, span] { progress_.wait_landed(span); });
      }
      for (const int before : plan_.tasks[task].after) {
        if (plan_.tasks[before].kind != TaskKind::kWeightsIn) continue;
        const auto filled = started_.find(before);
        LAYUP_CHECK(filled != started_.end(), "internal error: task ", task,
                    " reads a ring slot whose fill has not started");
        TraceSpan traced(trace_, track_, "wait_weights_in", plan_.tasks[before].span - 1);
        model_.device().order_after(*filled->second.get());  // get() rethrows a failed fill
      }
    }

   private:
    const StepPlan& plan_;
    HostUpdatedModel& model_;
    const CpuProgress& progress_;
    TraceRecorder* const trace_;
    const int track_;
    std::vector<int> fills_;  // the plan's fills, in the to-device lane's order
    size_t next_ = 0;         // the first of fills_ not started
    std::map<int, WeightRing::Filled> started_;
  };

  bool sharded() const { return device_tier_.sharded() || model_.sharded(); }

  // step(), ZeRO-1 of the host's state, the norm finite: every CPU-updated span's part updated and
  // its weights gathered, in layout order on this thread (the consumer is done with MPI, and the
  // device thread's gathers come after).
  void update_host_parts(const AdamWStep& adamw) {
    for (size_t index = 0; index < layout_.spans().size(); ++index) {
      if (device_tier_.holds(index)) continue;
      const float* grads = route_->kept(index);
      LAYUP_CHECK(grads != nullptr, "span ", index, "'s gradient is gone before its update");
      model_.update_span_part(index, grads, adamw, cpu_track_);
    }
  }

  // Returns once no update of the host state or the device copy is in flight (updates run past
  // the end of a step).
  void finish_updates() const { progress_.wait_all_landed(); }

  // The updates of the host-updated head spans (embeddings, final norm) of one step: step() decides
  // them once the norm is known (an AdamW step, or none), the consumer reports their gradient on
  // the host; whichever comes second submits them. With one micro-batch the norm is known from the
  // device's sums of squares before the head's gradient (the embeddings': the largest span) has
  // landed, so the block updates start meanwhile. Guarded by `mutex`.
  struct HeadUpdate {
    std::mutex mutex;
    bool decided = false, landed = false;
    bool update = false;  // decided: whether the spans are updated
    AdamWStep adamw{};
    HostUpdatedModel::OptimizerState from{}, to{};
    std::vector<RoutedGradient> grads;  // landed: per host-updated head span
  };

  // What one step's device work and consumes share; set before the device thread starts.
  struct StepContext {
    StepTiming* timing = nullptr;
    HostUpdatedModel::OptimizerState from{},
        to{};                          // where the step's host updates read and write the state
    AdamWStep unclipped{};             // what an update during backward uses (clip factor 1)
    std::shared_ptr<HeadUpdate> head;  // null where no head span is updated on the host
  };

  // This rank's micro-batches and every other rank's: the step's global batch.
  size_t global_micro_batches(size_t micro_batches) const {
    return micro_batches * static_cast<size_t>(model_.rank_count());
  }

  void check_step(std::span<const TokenBatch> micro_batches, float clip_max_norm) const {
    LAYUP_CHECK(!micro_batches.empty(), "a training step needs at least one micro-batch");
    LAYUP_CHECK(!broken_, "the ", name_of(mode_),
                " schedule failed in an earlier step and cannot continue");
    const bool layer_major = options_.accumulation == Accumulation::kLayerMajor;
    LAYUP_CHECK(options_.host_gradient || route_ == nullptr ||
                    (clip_max_norm <= 0.0f && (micro_batches.size() == 1 || layer_major)),
                "this layup schedule keeps no whole-model gradient on the host (planned for "
                "--clip none and one micro-batch, or layer-major accumulation), so it cannot "
                "clip (asked: ",
                clip_max_norm,
                ") or accumulate micro-batch by micro-batch (asked: ", micro_batches.size(),
                " micro-batches); plan the run with clipping or --grad-accum to keep one");
    if (layer_major)
      for (const TokenBatch& batch : micro_batches)
        LAYUP_CHECK(
            batch.batch == micro_batches[0].batch && batch.seq_len == micro_batches[0].seq_len,
            "layer-major accumulation needs micro-batches of one shape (got ", batch.batch, " x ",
            batch.seq_len, " beside ", micro_batches[0].batch, " x ", micro_batches[0].seq_len,
            "); use --accumulate micro-batch-major");
  }

  // step(), before the device thread starts. Nothing here is touched by what may still run from
  // the last step (its updates, the landing of its head gradient).
  StepContext begin_step(const StepPlan& step_plan, const UpdateSettings& settings) {
    std::fill(span_sum_sq_.begin(), span_sum_sq_.end(), 0.0);
    std::fill(block_updated_.begin(), block_updated_.end(), 0);
    device_tier_.begin_step(static_cast<size_t>(step_plan.micro_batches));
    if (step_plan.accumulation == Accumulation::kLayerMajor)
      layer_major_.begin_step(static_cast<size_t>(step_plan.micro_batches),
                              model_.backend().micro_batch_state_bytes(),
                              model_.backend().hidden_state_bytes());
    StepContext context;
    // A plan that updates after the norm whether it clips or not (offload's) says so; else the
    // clip threshold and the last step choose (UpdateTiming).
    // ZeRO-1 of the host's state: every update after the norm (update_host_parts).
    context.timing = model_.sharded() || (step_plan.window == UpdateWindow::kAfterNorm &&
                                          settings.clip_max_norm <= 0.0f)
                         ? &timing_.deferred()
                         : &timing_.begin_step(settings.clip_max_norm);
    context.from = model_.current_state();
    context.to = context.timing->speculative() ? model_.spare_state() : context.from;
    context.unclipped = settings.adamw;
    context.unclipped.grad_scale = 1.0f;
    if (!host_head_spans_.empty() && !model_.sharded())
      context.head = std::make_shared<HeadUpdate>();
    if (model_.disk_tier() != nullptr) {
      // The disk blocks' updates in the order the timing runs them, for the tier to read ahead:
      // as backward reaches them (top down), or after the norm (bottom up); the next step's
      // too, so that the disk does not idle between the steps.
      std::vector<size_t> order = model_.disk_tier()->spans();
      if (context.timing->during_backward()) std::reverse(order.begin(), order.end());
      model_.disk_tier()->expect_step(order);
    }
    return context;
  }

  // The plan of steps of `micro_batches`, clipping or not, compiled once.
  const StepPlan& plan_for(size_t micro_batches, bool clipping) {
    const auto key = std::make_pair(micro_batches, clipping);
    auto found = plans_.find(key);
    if (found == plans_.end())
      found = plans_
                  .emplace(key, compile_step_plan(mode_, layout_, options_, model_.device().kinds(),
                                                  static_cast<int>(micro_batches), clipping))
                  .first;
    return found->second;
  }

  // Device thread: the device lane of the step's plan, micro-batch by micro-batch, and its copies
  // to the host, each gradient handed on to the consumer where the plan copies it. One backend call
  // runs a micro-batch's forward over every span (waiting span by span for updates still landing:
  // ForwardWaits), so the forward runs at the first span's task (layer-major: one call a span's
  // task, forward_layer_major); the device's adds of micro-batches
  // are parts of backward_block_on_device and backward_embeddings; the head's copies are one
  // consume (consume_head), handed on after backward_embeddings; the device's AdamW runs in step(),
  // once the norm is known.
  void device_step(std::span<const TokenBatch> micro_batches, const StepPlan& step_plan,
                   const StepContext& context, double& loss_sum) {
    const ParameterPointers params = model_.device_params();
    const float loss_scale = 1.0f / static_cast<float>(global_micro_batches(micro_batches.size()));
    const int final_norm = static_cast<int>(layout_.spans().size()) - 1;
    bool update_now = false;
    std::vector<std::optional<SlotLease>> leases(layout_.spans().size());  // per block span
    const bool layer_major = step_plan.accumulation == Accumulation::kLayerMajor;
    StepFills fills(step_plan, model_, progress_, trace_, device_track_);
    // Per micro-batch, per span: its forward's task, which the forward's hooks run the fills of.
    std::vector<std::vector<int>> forward_tasks(micro_batches.size(),
                                                std::vector<int>(layout_.spans().size(), -1));
    for (size_t t = 0; t < step_plan.tasks.size(); ++t) {
      const PlanTask& task = step_plan.tasks[t];
      if (task.kind == TaskKind::kForward && task.lane == Lane::kDevice)
        forward_tasks[static_cast<size_t>(task.micro_batch)][static_cast<size_t>(task.span)] =
            static_cast<int>(t);
    }
    for (const PlanTask& task : step_plan.tasks) {
      // A copy once a step is of a sum the device took (layer-major): to the host it is one
      // micro-batch's gradient. (A staged block's state copied back is the staging thread's.)
      const bool gradient_copy = task.kind == TaskKind::kGradientToHost;
      const bool summed = task.micro_batch < 0;
      if (summed && !gradient_copy) continue;
      const size_t k = summed ? 0 : static_cast<size_t>(task.micro_batch);
      const bool first = summed || k == 0;
      const bool last = summed || k + 1 == micro_batches.size();
      const bool block = task.span > 0 && task.span < final_norm;
      if (gradient_copy && block) {
        hand_on(task.span - 1, std::exchange(leases[task.span], std::nullopt), first, last,
                update_now ? &context : nullptr);  // route, then timing
        continue;
      }
      if (task.lane != Lane::kDevice) continue;
      fills.before(static_cast<int>(&task - step_plan.tasks.data()));
      // A slot's backward waits for its slot (acquire_slot), the head's for its buffers (below);
      // a forward that waits for the host's copies (offload's next micro-batch) for them all.
      if (task.kind == TaskKind::kForward && waits_for_host(step_plan, task))
        progress_.wait_consumed();
      if (task.kind == TaskKind::kForward && layer_major) {
        // The span's fill (a streamed block) was started and ordered before it, above.
        loss_sum += forward_layer_major(task.span, micro_batches[k], k, params);
        if (task.span == final_norm)
          update_now = context.timing->during_backward() && last &&
                       std::isfinite(static_cast<float>(loss_sum / micro_batches.size()));
        continue;
      }
      if (task.kind == TaskKind::kForward && task.span == 0) {
        {
          TraceSpan traced(trace_, device_track_, "forward");
          const std::vector<int>& forwards = forward_tasks[k];
          loss_sum += forward_pass(
              micro_batches[k], [&fills, &forwards](size_t span) { fills.before(forwards[span]); });
        }
        // The mean loss is complete before the last backward: a non-finite one updates nothing.
        update_now = context.timing->during_backward() && last &&
                     std::isfinite(static_cast<float>(loss_sum / micro_batches.size()));
      } else if (task.kind == TaskKind::kBackward && task.span == final_norm) {
        // The consumer must be done with the head's gradients of the last micro-batch (or step)
        // before backward_head overwrites them.
        if (!first) progress_.wait_consumed();
        progress_.wait_head_landed();
        if (layer_major) {
          backward_head_layer_major(params, k, last, loss_scale);
          continue;
        }
        TraceSpan traced(trace_, device_track_, trace_name(task.kind, SpanKind::kFinalNorm));
        model_.backend().backward_head(params, gradients_.head(layout_.spans().size() - 1),
                                       gradients_.head(0), loss_scale);
      } else if (task.kind == TaskKind::kBackward && task.span == 0) {
        if (layer_major)
          backward_embeddings_layer_major(params, k, last, context.head);
        else
          backward_embeddings(params, first, last, context.head);
      } else if (task.kind == TaskKind::kBackward && layer_major) {
        const int layer = task.span - 1;
        if (first && step_plan.spans[task.span].gradient == GradientTarget::kSlot)
          leases[task.span] = acquire_slot(layer);
        backward_block_layer_major(layer, step_plan.spans[task.span].gradient,
                                   leases[task.span] ? leases[task.span]->data : nullptr, params, k,
                                   last);
      } else if (task.kind == TaskKind::kBackward) {
        const int layer = task.span - 1;
        if (step_plan.spans[task.span].site == UpdateSite::kDevice) {
          backward_block_on_device(layer, params, first, last);  // its gradient stays there
          continue;
        }
        switch (step_plan.spans[task.span].gradient) {
          case GradientTarget::kOwnBuffer:
            fail("internal error: block ", layer,
                 "'s gradient has a buffer of its own, and the "
                 "plan updates it on the host");
          case GradientTarget::kSlot:
            leases[task.span] = acquire_slot(layer);
            backward_block(layer, leases[task.span]->data, params, first, last);
            break;
          case GradientTarget::kWholeGradient:
            backward_block(layer, gradients_.block(layer), params, first, last);
            break;
        }
      }
    }
  }

  // Device thread, layer-major: span `span`'s forward of micro-batch k (ModelBackend::
  // forward_block and its siblings), on the micro-batch's hidden state and store, once the span's
  // update of the last step has landed (ForwardWaits, traced as the forward's spans are). Returns
  // the micro-batch's loss at the final norm, else 0.
  double forward_layer_major(int span, const TokenBatch& batch, size_t k,
                             const ParameterPointers& params) {
    const int final_norm = static_cast<int>(layout_.spans().size()) - 1;
    ForwardWaits waits(progress_, static_cast<size_t>(final_norm), trace_, device_track_);
    ModelBackend& backend = model_.backend();
    double loss = 0.0;
    if (span == 0)
      backend.forward_embeddings(params, batch, layer_major_.hidden(k), layer_major_.store(k),
                                 waits);
    else if (span == final_norm)
      loss = backend.forward_head(params, batch, layer_major_.hidden(k), waits);
    else
      backend.forward_block(span - 1, params, layer_major_.hidden(k), layer_major_.store(k), waits);
    waits.finish();
    return loss;
  }

  // Whether the step's norm waits for a head span's gradient on the host.
  static bool norm_waits_for_head(const StepPlan& step_plan) {
    const int last = static_cast<int>(step_plan.spans.size()) - 1;
    for (const PlanTask& task : step_plan.tasks)
      if (task.kind == TaskKind::kNorm)
        return std::any_of(task.after.begin(), task.after.end(), [&](int before) {
          const PlanTask& waited = step_plan.tasks[static_cast<size_t>(before)];
          return waited.lane != Lane::kDevice && (waited.span == 0 || waited.span == last) &&
                 step_plan.spans[static_cast<size_t>(waited.span)].site != UpdateSite::kDevice;
        });
    return false;
  }

  // Whether a device task waits for the host to have taken gradients the device overwrites next
  // (offload's next micro-batch, whose backward writes the gradient the host is still copying).
  static bool waits_for_host(const StepPlan& step_plan, const PlanTask& task) {
    return std::any_of(task.after.begin(), task.after.end(), [&](int before) {
      return step_plan.tasks[static_cast<size_t>(before)].lane != Lane::kDevice;
    });
  }

  // Device thread: slot layer % 2, once the CPU side has given it back. The trace shows the wait:
  // the stall the double buffer costs when the CPU side is slower than a block's backward.
  SlotLease acquire_slot(int layer) {
    TraceSpan traced(trace_, device_track_, "wait_slot", layer);
    return gradients_.slots().acquire(layer);
  }

  // Device thread: a host-updated block's backward into `grad` (a slot or its part of the
  // whole-model gradient, which it overwrites), with one micro-batch the device's sum of squares
  // of it.
  void backward_block(int layer, float* grad, const ParameterPointers& params, bool first,
                      bool last) {
    TraceSpan traced(trace_, device_track_, "backward_block", layer);
    model_.backend().backward_block(layer, params, grad);
    if (first && last) model_.start_device_sum_of_squares(1 + static_cast<size_t>(layer), grad);
  }

  // Device thread: a device-updated block's backward into its own gradient (gpu: its part of the
  // whole-model gradient); with several micro-batches through a slot (gpu: that part), added
  // into the sum.
  void backward_block_on_device(int layer, const ParameterPointers& params, bool first, bool last) {
    const size_t index = 1 + layer;
    if (first && last) {
      TraceSpan traced(trace_, device_track_, "backward_block", layer);
      model_.backend().backward_block(layer, params, device_tier_.block_gradient(layer));
    } else if (gradients_.whole()) {
      {
        TraceSpan traced(trace_, device_track_, "backward_block", layer);
        model_.backend().backward_block(layer, params, gradients_.block(layer));
      }
      device_tier_.add(index, gradients_.block(layer), first);
    } else {
      const SlotLease lease = acquire_slot(layer);
      {
        TraceSpan traced(trace_, device_track_, "backward_block", layer);
        model_.backend().backward_block(layer, params, lease.data);
        device_tier_.add(index, lease.data, first);
      }
      gradients_.slots().release(lease);  // its next backward runs after the add, in device order
    }
    if (last) final_on_device(index);
  }

  // Device thread: device-updated span `index`'s gradient is final (its last backward or add is
  // issued). One rank: its sum of squares, taken where it lies. Several: its sum over the ranks
  // handed to the consumer (the plan's ranks lane), which starts it while the device computes the
  // spans below (on CUDA on the collectives' stream, after a fence here); the sum of squares is
  // taken of the sum once every span's is in (device_spans_sums_of_squares).
  void final_on_device(size_t index) {
    if (model_.ranks() == nullptr) {
      model_.start_device_sum_of_squares(index, device_tier_.gradient(index));
      return;
    }
    std::shared_ptr<const DeviceFence> final = model_.device().fence();
    progress_.consume_submitted();
    to_consumer([this, index, final] {
      run_task([&] {
        const Span& span = layout_.spans()[index];
        {
          TraceSpan traced(trace_, ranks_track_, trace_name(TaskKind::kSumOverRanks, span.kind),
                           span.layer);
          if (device_tier_.sharded()) {
            model_.device().wait_for(*final);  // ZeRO-1: on the CPU backend, already passed
            device_tier_.reduce_scatter(index);
          } else {
            sums_over_ranks_[index] =
                device_tier_.start_sum_over_ranks(index, *collectives_, *final);
          }
        }
        progress_.consume_done();
      });
    });
  }

  // Device thread, layer-major: micro-batch k's head backward, parked in its store (beside the
  // tokens and block inputs its forward put there) until its first block's backward; the final
  // norm's gradient (complete now) added into the device tier's sum or handed to the host, which
  // sums it as it sums a micro-batch-major step's.
  void backward_head_layer_major(const ParameterPointers& params, size_t k, bool last,
                                 float loss_scale) {
    const size_t final_norm = layout_.spans().size() - 1;
    float* final_norm_grad = gradients_.head(final_norm);
    {
      TraceSpan traced(trace_, device_track_,
                       trace_name(TaskKind::kBackward, SpanKind::kFinalNorm));
      model_.backend().backward_head(params, final_norm_grad, embeddings_output(k), loss_scale);
      model_.backend().park_micro_batch(layer_major_.store(k), /*with_inputs=*/false);
      if (device_tier_.holds(final_norm)) device_tier_.add(final_norm, final_norm_grad, k == 0);
    }
    if (!device_tier_.holds(final_norm))
      hand_on_head_span(final_norm, final_norm_grad, k == 0, last);
  }

  // Layer-major: where micro-batch k's backward writes the embeddings' gradient. A tied
  // embedding's holds the LM head's part from backward_head until the input's part is added at
  // the end of the backward: one buffer a micro-batch.
  float* embeddings_output(size_t k) const {
    float* own = layer_major_.embeddings_output(k);
    return own != nullptr ? own : gradients_.head(0);
  }

  // Device thread, layer-major: the embeddings' gradient of micro-batch k (written by
  // backward_head, or an untied head's zeros written here again, then the input's part added),
  // summed as the final norm's; after the last, every sum of squares and the head's landing.
  void backward_embeddings_layer_major(const ParameterPointers& params, size_t k, bool last,
                                       const std::shared_ptr<HeadUpdate>& head) {
    float* output = embeddings_output(k);
    const bool on_device = device_tier_.holds(0);
    {
      TraceSpan traced(trace_, device_track_, "backward_embeddings");
      if (layer_major_.embeddings_output(k) == nullptr) {
        // The consumer has taken the micro-batch before's from here.
        if (!on_device && k > 0) progress_.wait_consumed();
        model_.device().fill_zero(output, layout_.spans()[0].count);
      }
      model_.backend().resume_micro_batch(layer_major_.store(k), -1);
      model_.backend().backward_embeddings(params, output);
      if (on_device) device_tier_.add(0, output, k == 0);
    }
    if (!last) {
      if (!on_device) hand_on_head_span(0, output, k == 0, false);
      return;
    }
    for (const size_t index : device_tier_.spans())
      if (index == 0 || index + 1 == layout_.spans().size()) final_on_device(index);
    std::shared_ptr<const DeviceFence> written = model_.device().fence();
    progress_.consume_submitted();
    if (head != nullptr) progress_.head_landing_submitted();
    to_consumer([this, written, output, on_device, head] {
      run_task([&] {
        {
          TraceSpan traced(trace_, consumer_track_, "consume head");
          if (!on_device) take_head_span(0, output, *written, /*first=*/false, /*last=*/true);
          model_.device().wait_for(*written);
          device_spans_sums_of_squares();
          progress_.consume_done();
        }
        std::vector<RoutedGradient> routed;
        for (const size_t index : host_head_spans_) routed.push_back(head_routed_[index]);
        head_gradients_landed(head, std::move(routed));
      });
    });
  }

  // Device thread, layer-major: one micro-batch's gradient of host-updated head span `index` at
  // `data` to the consumer, which adds it into the host's sum.
  void hand_on_head_span(size_t index, const float* data, bool first, bool last) {
    std::shared_ptr<const DeviceFence> written = model_.device().fence();
    progress_.consume_submitted();
    to_consumer([this, index, data, written, first, last] {
      run_task([&] {
        {
          TraceSpan traced(trace_, consumer_track_, "consume head");
          take_head_span(index, data, *written, first, last);
        }
        progress_.consume_done();
      });
    });
  }

  // Consumer, layer-major: a head span's gradient of one micro-batch into the host's sum; after
  // the last, the sum's sum of squares and where it lies, kept for the head's landing.
  void take_head_span(size_t index, const float* data, const DeviceFence& written, bool first,
                      bool last) {
    RoutedGradient routed = head_route().take({index, data, &written, -1, nullptr}, first, last);
    if (!last) return;
    span_sum_sq_[index] = routed.host_sum_sq;
    head_routed_[index] = std::move(routed);
    if (model_.ranks() != nullptr) {
      TraceSpan summed(trace_, ranks_track_,
                       trace_name(TaskKind::kSumOverRanks, layout_.spans()[index].kind));
      span_sum_sq_[index] = model_.sum_gradient_over_ranks(index);
    }
  }

  // The route of the host-updated head spans' gradients: the blocks' route, or (layer-major
  // without a whole host gradient) the host's sum of the head alone.
  GradientRoute& head_route() const { return head_route_ ? *head_route_ : *route_; }

  // Layer-major without a whole host gradient: the host sums only the head's micro-batches.
  static bool head_accumulator_only(const ScheduleOptions& options) {
    return options.accumulation == Accumulation::kLayerMajor && !options.host_gradient;
  }
  // The head spans the blocks' route lands (a landing buffer each, where it has them): none where
  // the head has a route of its own.
  static std::vector<size_t> block_route_head_spans(const ScheduleOptions& options,
                                                    const std::vector<size_t>& head_spans) {
    return head_accumulator_only(options) ? std::vector<size_t>{} : head_spans;
  }

  // Device thread, layer-major: block `layer`'s backward of micro-batch k from its store, summed
  // over the micro-batches (after the last, the sum's sum of squares, as for one micro-batch's
  // gradient):
  //   a slot (`slot`, slot layer % 2): the first micro-batch's written there, each later one's
  //     into the other slot (free once the host has the block above) and added;
  //   a device-updated block: each written into slot layer % 2 and added into its own sum;
  //   offload: each written into the block output and added into its part of the whole gradient.
  // A sum that starts from the first micro-batch's gradient (the slot) differs from one that
  // starts from +0 (the others, the host's) only in the sign of an element that is zero in every
  // micro-batch, which no norm, moment or weight can tell.
  void backward_block_layer_major(int layer, GradientTarget target, float* slot,
                                  const ParameterPointers& params, size_t k, bool last) {
    const size_t index = 1 + static_cast<size_t>(layer);
    const size_t count = layout_.spans()[index].count;
    std::optional<SlotLease> scratch_slot;
    float* output = nullptr;
    switch (target) {
      case GradientTarget::kSlot:
        if (k == 1) other_slot_ = acquire_slot(layer + 1);
        output = k == 0 ? slot : other_slot_->data;
        break;
      case GradientTarget::kOwnBuffer:
        scratch_slot = acquire_slot(layer);
        output = scratch_slot->data;
        break;
      case GradientTarget::kWholeGradient:
        output = layer_major_.block_output();
        break;
    }
    TraceSpan traced(trace_, device_track_, "backward_block", layer);
    model_.backend().resume_micro_batch(layer_major_.store(k), layer);
    model_.backend().backward_block(layer, params, output);
    model_.backend().park_micro_batch(layer_major_.store(k), /*with_inputs=*/false);
    float* sum = nullptr;
    switch (target) {
      case GradientTarget::kSlot:
        sum = slot;
        if (k > 0) model_.device().add(sum, output, count);
        // The next user of the other slot is the device, after this add in its order.
        if (last && other_slot_) gradients_.slots().release(*std::exchange(other_slot_, {}));
        break;
      case GradientTarget::kOwnBuffer:
        device_tier_.add(index, output, k == 0);
        gradients_.slots().release(*scratch_slot);
        sum = device_tier_.gradient(index);
        break;
      case GradientTarget::kWholeGradient:
        sum = gradients_.block(layer);
        if (k == 0) model_.device().fill_zero(sum, count);
        model_.device().add(sum, output, count);
        break;
    }
    if (!last) return;
    if (target == GradientTarget::kOwnBuffer)
      final_on_device(index);
    else
      model_.start_device_sum_of_squares(index, sum);
  }

  // Device thread: block `layer`'s gradient (in the slot `lease` holds, else in the whole-model
  // gradient) goes to the consumer once the backward that wrote it has passed; with `update`, the
  // block is updated as that step's timing says.
  void hand_on(int layer, std::optional<SlotLease> lease, bool first, bool last,
               const StepContext* update) {
    std::shared_ptr<const DeviceFence> written = model_.device().fence();
    progress_.consume_submitted();
    to_consumer([this, layer, lease, written, first, last, update] {
      run_task([&] {
        consume_block(layer, lease, *written, first, last, update);
        progress_.consume_done();
      });
    });
  }

  // Consumer: one micro-batch's gradient of a host-updated block, complete once `written` has
  // passed, handed on by the route (which gives its slot back, where it has one); after the last,
  // the block's sum of squares and, when the timing says so, its update (from `update`'s state).
  void consume_block(int layer, const std::optional<SlotLease>& lease, const DeviceFence& written,
                     bool first, bool last, const StepContext* update) {
    const size_t index = 1 + static_cast<size_t>(layer);
    RoutedGradient routed;
    {
      TraceSpan traced(trace_, consumer_track_, "consume block", layer);
      GradientSource source;
      if (lease) {
        const SlotLease held = *lease;
        source = {
            index, held.data, &written, held.slot,
            std::make_shared<ReleaseOnce>([this, held] { gradients_.slots().release(held); })};
      } else {
        source = {index, gradients_.block(layer), &written, -1, nullptr};
      }
      routed = route_->take(source, first, last);
      if (!last) return;
      span_sum_sq_[index] = first ? model_.device_sum_of_squares(index) : routed.host_sum_sq;
      // Before any update reads it: the block's gradient over every rank, in the accumulator.
      if (model_.ranks() != nullptr) {
        TraceSpan summed(trace_, ranks_track_,
                         trace_name(TaskKind::kSumOverRanks, SpanKind::kBlock), layer);
        span_sum_sq_[index] = model_.sum_gradient_over_ranks(index);
      }
    }
    if (update != nullptr && update->timing->update_now(span_sum_sq_[index])) {
      block_updated_[layer] = 1;  // before this consume reports done, so step() sees it
      progress_.update_submitted(index);
      enqueue_update(index, routed.grads, update->from, update->to, update->unclipped,
                     std::move(routed.read_done));
    }
  }

  // Consumer, after the step's device work (the device is idle until step() returns, so the sums
  // go in its order from here): the device-updated spans' sums of squares, which with several
  // ranks are of their gradient summed over the ranks (ZeRO-1: into each rank's part by the device
  // tier; else in place, rank order from +0 as the host's sums, then taken again). Every span's
  // sum over the ranks was started by now (final_on_device, earlier on this thread).
  void device_spans_sums_of_squares() {
    if (device_tier_.sharded()) {
      device_tier_.sums_of_squares_of_parts(span_sum_sq_, trace_, ranks_track_);
      return;
    }
    if (model_.ranks() != nullptr) {
      for (const size_t index : device_tier_.spans()) {
        LAYUP_CHECK(sums_over_ranks_[index] != nullptr, "internal error: span ", index,
                    "'s sum over the ranks was never started");
        // The device's later work (these sums, AdamW, the next step's backward) after the sum.
        model_.device().order_after(*std::exchange(sums_over_ranks_[index], nullptr));
        model_.start_device_sum_of_squares(index, device_tier_.gradient(index));
      }
      model_.device().wait_for(*model_.device().fence());
    }
    for (const size_t index : device_tier_.spans())
      span_sum_sq_[index] = model_.device_sum_of_squares(index);
  }

  // Device thread: the embeddings' backward (tied wte's second part), the device-updated head
  // spans' gradients summed over micro-batches, the device's sums of squares, and the head's
  // consume.
  void backward_embeddings(const ParameterPointers& params, bool first, bool last,
                           const std::shared_ptr<HeadUpdate>& head) {
    {
      TraceSpan traced(trace_, device_track_, "backward_embeddings");
      model_.backend().backward_embeddings(params, gradients_.head(0));
      for (const size_t index : {size_t{0}, layout_.spans().size() - 1}) {
        const float* micro_batch = gradients_.head(index);
        if (!device_tier_.holds(index)) {
          if (first && last) model_.start_device_sum_of_squares(index, micro_batch);
          continue;
        }
        if (!(first && last)) device_tier_.add(index, micro_batch, first);
        if (last) final_on_device(index);
      }
    }
    std::shared_ptr<const DeviceFence> written = model_.device().fence();
    progress_.consume_submitted();
    if (last && head != nullptr) progress_.head_landing_submitted();
    to_consumer([this, written, first, last, head = last ? head : nullptr] {
      run_task([&] { consume_head(*written, first, last, head); });
    });
  }

  // Consumer: the head's gradients of one micro-batch (complete once `written` has passed). With
  // several, the host-updated head spans' go into the accumulator. After the last, every sum of
  // squares the device took is reported first (the step's norm needs nothing more), then the
  // host-updated head spans' gradient lands (one micro-batch) and `head` learns where it is.
  void consume_head(const DeviceFence& written, bool first, bool last,
                    const std::shared_ptr<HeadUpdate>& head) {
    const bool one_micro_batch = first && last;
    std::vector<RoutedGradient> routed;
    {
      TraceSpan traced(trace_, consumer_track_, "consume head");
      if (!one_micro_batch)
        for (const size_t index : host_head_spans_) {
          routed.push_back(head_route().take(head_source(index, written), first, last));
          if (last) span_sum_sq_[index] = routed.back().host_sum_sq;
        }
      if (last) {
        model_.device().wait_for(written);
        device_spans_sums_of_squares();
        if (one_micro_batch)
          for (const size_t index : host_head_spans_)
            span_sum_sq_[index] = model_.device_sum_of_squares(index);
        if (model_.ranks() != nullptr) {
          // The norm needs the head's gradient summed over the ranks: it lands first.
          if (one_micro_batch)
            for (const size_t index : host_head_spans_)
              routed.push_back(head_route().take(head_source(index, written), first, last));
          for (const size_t index : host_head_spans_) {
            TraceSpan summed(trace_, ranks_track_,
                             trace_name(TaskKind::kSumOverRanks, layout_.spans()[index].kind));
            span_sum_sq_[index] = model_.sum_gradient_over_ranks(index);
          }
        }
      }
      progress_.consume_done();
      if (one_micro_batch && model_.ranks() == nullptr)
        for (const size_t index : host_head_spans_)
          routed.push_back(head_route().take(head_source(index, written), first, last));
    }
    head_gradients_landed(head, std::move(routed));
  }

  // Consumer: the host-updated head spans' gradients of the step are where `routed` says (one per
  // span, in host_head_spans_ order); their update goes once step() has decided it too.
  void head_gradients_landed(const std::shared_ptr<HeadUpdate>& head,
                             std::vector<RoutedGradient> routed) {
    if (head == nullptr) return;
    bool submit = false;
    {
      std::lock_guard lock(head->mutex);
      head->grads = std::move(routed);
      head->landed = true;
      submit = head->decided && head->update;
    }
    // After `landed`: a step() that waited for this sees it, and decides with the gradient there.
    progress_.head_landed();
    if (submit) submit_head_updates(*head);
  }

  // step(): the host-updated head spans are updated with `adamw` (null: not at all), counted as
  // submitted now, so that the next forward waits for them.
  void decide_head_update(HeadUpdate& head, const StepContext& context, const AdamWStep* adamw) {
    if (adamw != nullptr)
      for (const size_t index : host_head_spans_) progress_.update_submitted(index);
    bool submit = false;
    {
      std::lock_guard lock(head.mutex);
      head.decided = true;
      head.update = adamw != nullptr;
      if (adamw != nullptr) {
        head.adamw = *adamw;
        head.from = context.from;
        head.to = context.to;
      }
      submit = head.update && head.landed;
    }
    if (submit) submit_head_updates(head);
  }

  // Ahead of the block updates still queued: the next forward reads the embeddings first. Called
  // once both halves are in (no one writes `head` any more).
  void submit_head_updates(const HeadUpdate& head) {
    for (size_t i = 0; i < host_head_spans_.size(); ++i)
      enqueue_update(host_head_spans_[i], head.grads[i].grads, head.from, head.to, head.adamw,
                     head.grads[i].read_done, /*urgent=*/true);
  }

  // step(), the norm finite: the host-updated blocks' updates the timing left for now, in forward
  // order. One submitted again runs after its speculative one (the coordinator runs tasks in
  // order), and a forward waits for both.
  void submit_block_updates(const StepContext& context, const AdamWStep& adamw, bool clipped,
                            StepStats& stats) {
    for (int layer = 0; layer < layout_.config().n_layer; ++layer) {
      const size_t index = 1 + layer;
      if (device_tier_.holds(index)) continue;
      switch (context.timing->after_norm(layer, block_updated_[layer] != 0, clipped)) {
        case BlockUpdate::kDone:
          continue;
        case BlockUpdate::kRedo:
          stats.blocks_redone += 1;
          break;
        case BlockUpdate::kCatchUp:
          stats.blocks_deferred += 1;
          break;
        case BlockUpdate::kNow:
          break;
      }
      const float* grads = route_->kept(index);
      LAYUP_CHECK(grads != nullptr, "block ", layer, "'s gradient is gone before its update");
      progress_.update_submitted(index);
      enqueue_update(index, grads, context.from, context.to, adamw, nullptr);
    }
  }

  // step(), the loss or the norm not finite: nothing changes. A speculative step left the current
  // state alone; the device copy of the blocks it updated is refreshed from it once those updates
  // have landed.
  void abandon_step(const StepContext& context) {
    if (context.head != nullptr) decide_head_update(*context.head, context, nullptr);
    if (context.timing->speculative()) {
      progress_.wait_all_landed();
      for (int layer = 0; layer < layout_.config().n_layer; ++layer)
        if (block_updated_[layer]) model_.refresh_device_weights(1 + layer);
    }
    timing_.end_step(/*clipped=*/true);
  }

  // Hands span `index`'s update (AdamW from `grads`, reading `from`, writing `to`) to the
  // coordinator, urgent ones ahead of every queued one; the caller counted it as submitted, and
  // it is in flight until its weights have landed. `read_done` (when given) runs once the AdamW
  // has read `grads`.
  void enqueue_update(size_t index, const float* grads,
                      const HostUpdatedModel::OptimizerState& from,
                      const HostUpdatedModel::OptimizerState& to, const AdamWStep& adamw,
                      std::shared_ptr<ReleaseOnce> read_done, bool urgent = false) {
    auto task = [this, index, grads, from, to, adamw, read_done = std::move(read_done)] {
      run_task([&] { run_update(index, grads, from, to, adamw); });
      if (read_done) read_done->now();
    };
    // A staged block's update runs on the device, beside the CPU's: its own thread issues it.
    if (model_.staged(index))
      stager_.submit(std::move(task));
    else if (urgent)
      coordinator_.submit_urgent(std::move(task));
    else
      coordinator_.submit(std::move(task));
  }

  // Coordinator: AdamW on span `index`, its landing reported to progress_. update_span's trace
  // span ends before the landing is reported, so a forward that waited for it starts after it in
  // the trace too.
  void run_update(size_t index, const float* grads, const HostUpdatedModel::OptimizerState& from,
                  const HostUpdatedModel::OptimizerState& to, const AdamWStep& adamw) {
    progress_.transfer_starting();
    try {
      model_.update_span(index, grads, from, to, adamw,
                         model_.staged(index) ? staging_track_ : cpu_track_,
                         [this, index] { progress_.update_landed(index); });
    } catch (...) {
      progress_.transfer_abandoned();
      throw;
    }
  }

  // The device lane's work of a step (device_step, the device's AdamW), on the device thread; a
  // step with no CPU side (gpu mode) runs it on the calling thread, as a single loop would: each
  // hand-off between threads is a sleeping thread's wake-up while the GPU waits.
  void on_device_lane(const std::function<void()>& work) {
    if (steps_on_caller_)
      work();
    else
      device_thread_.run(work);
  }

  // A consume (a gradient taken off the device, the sums of squares read) on the consumer; with no
  // CPU side, at once on the device lane's thread.
  void to_consumer(std::function<void()> task) {
    if (steps_on_caller_)
      task();
    else
      consumer_.submit(std::move(task));
  }

  // Runs a consumer or coordinator task; a failure is kept in progress_, so that nobody waits
  // forever for what the task would have reported, and rethrown to the pool.
  template <class Task>
  void run_task(Task&& task) {
    try {
      task();
    } catch (...) {
      progress_.fail(std::current_exception());
      throw;
    }
  }

  // Waits until the consumer and the coordinator are idle and the transfers they started have
  // landed; a task's failure stays in progress_ (the next wait on it throws) and makes the
  // schedule unusable.
  void wait_for_cpu_side() {
    try {
      consumer_.wait_idle();  // first: a consume may submit an update
      coordinator_.wait_idle();
      stager_.wait_idle();
    } catch (...) {
      broken_ = true;
    }
    progress_.wait_transfers_landed();
  }

  // A head span's gradient of one micro-batch, where backward_head and backward_embeddings leave
  // it (its own buffer, not a slot).
  GradientSource head_source(size_t index, const DeviceFence& written) const {
    return {index, gradients_.head(index), &written, -1, nullptr};
  }

  // The head spans (the embeddings: first in layout order; the final norm: last) that `sites`
  // leaves on the host.
  static std::vector<size_t> host_updated_head_spans(const ParameterLayout& layout,
                                                     const std::vector<UpdateSite>& sites) {
    std::vector<size_t> spans;
    for (const size_t index : {size_t{0}, layout.spans().size() - 1})
      if (sites.empty() || sites[index] == UpdateSite::kHost) spans.push_back(index);
    return spans;
  }

  // The device-updated spans' moments' kind: gpu's placement places its moments (every one of
  // them on the device side); offload's and layup's places the host's, and the device tier's take
  // the device's own memory.
  static MemoryKind device_moments_kind(Mode mode, const ScheduleOptions& options,
                                        DeviceKinds kinds) {
    return mode == Mode::kGpu ? options.kind_of(TensorClass::kOptimizerMoments, kinds.own)
                              : kinds.own;
  }

  // The weight gradients' kind: the placement's, else the device's own memory.
  static MemoryKind gradients_kind(const ScheduleOptions& options, DeviceKinds kinds) {
    return options.kind_of(TensorClass::kWeightGrads, kinds.own);
  }
  // The layer-major forward's hidden states are activations: the placement's kind for them, else
  // the device's own memory.
  static MemoryKind hidden_states_kind(const ScheduleOptions& options, DeviceKinds kinds) {
    return options.kind_of(TensorClass::kActivations, kinds.own);
  }

 public:
  // What a layup schedule allocates (make_layup_schedule's buffers).
  static BufferList buffers(Mode mode, const ParameterLayout& layout,
                            const ScheduleOptions& mode_agnostic, DeviceKinds kinds,
                            int micro_batches) {
    const ScheduleOptions options = mode_options(mode, layout, mode_agnostic);
    const MemoryKind grads_kind = gradients_kind(options, kinds);
    BufferList list = HostUpdatedModel::buffers(layout, options, kinds, mode == Mode::kGpu).list();
    append(list, MicroBatchGradients::buffers(layout, whole_gradient(mode), grads_kind));
    append(list, DeviceTier::buffers(layout, options, whole_gradient(mode), grads_kind,
                                     device_moments_kind(mode, options, kinds))
                     .list(micro_batches > 1));
    if (cpu_updates(layout, options))
      append(list, gradient_route_buffers(
                       options.host_gradient, layout, grads_kind, kinds,
                       block_route_head_spans(
                           options, host_updated_head_spans(layout, options.update_sites))));
    if (options.accumulation == Accumulation::kLayerMajor && micro_batches > 1)
      append(list, LayerMajorBuffers::buffers(layout, whole_gradient(mode), grads_kind,
                                              kinds.host_copy, hidden_states_kind(options, kinds),
                                              micro_batches, options.micro_batch_state_bytes,
                                              options.hidden_state_bytes));
    return list;
  }

 private:
  const Mode mode_;
  const ParameterLayout layout_;
  const ScheduleOptions options_;  // mode_options'
  TraceRecorder* trace_ = nullptr;
  int device_track_ = 0;  // "GPU" in trace_
  // Per micro-batch count and clipping, the plan whose device lane device_step runs.
  std::map<std::pair<size_t, bool>, StepPlan> plans_;
  HostUpdatedModel model_;
  const MemoryKind grads_kind_;    // the placement's kind for weight gradients
  MicroBatchGradients gradients_;  // where the backward writes
  DeviceTier device_tier_;
  // Per span, a device-updated span's fp32 weights and (weights landing in the compute copy) its
  // bf16 compute copy, which its AdamW writes.
  std::vector<float*> device_tier_weights_;
  std::vector<void*> device_tier_compute_copies_;
  const std::vector<size_t> host_head_spans_;
  const std::unique_ptr<GradientRoute> route_;
  const std::unique_ptr<GradientRoute> head_route_;  // null: the head goes route_'s way
  // Layer-major, per span: where the consumer left a host-updated head span's sum of the step.
  std::vector<RoutedGradient> head_routed_;
  UpdateTiming timing_;
  LayerMajorBuffers layer_major_;  // allocated at the first layer-major step
  // Layer-major, device thread: the slot a block's later micro-batches write before they are
  // added into the block's own slot.
  std::optional<SlotLease> other_slot_;
  // This step's, written by the consumer and read by step() after wait_consumed: per span the sum
  // of squares of its gradient; per block whether it was updated during backward.
  std::vector<double> span_sum_sq_;
  std::vector<char> block_updated_;
  int cpu_track_ = 0;       // "cpu workers" in trace_
  int staging_track_ = 0;   // "staging" in trace_: the staged blocks' updates
  int consumer_track_ = 0;  // "gradients to host" in trace_
  int ranks_track_ = 0;     // "ranks" in trace_ (several ranks): each sum over the ranks
  bool broken_ = false;
  // gpu mode: nothing of a step runs beside the device lane, which runs on the calling thread.
  const bool steps_on_caller_;
  CpuProgress progress_;
  // Where several ranks update spans on the device: those spans' sums over the ranks.
  std::unique_ptr<DeviceCollectives> collectives_;
  // Consumer, several ranks without ZeRO-1: per device-updated span, the fence after which this
  // step's sum over the ranks is in its gradient (null once the device is ordered after it).
  std::vector<std::shared_ptr<const DeviceFence>> sums_over_ranks_ =
      std::vector<std::shared_ptr<const DeviceFence>>(layout_.spans().size());
  // Last: threads stop (joined in their destructors) before the state they use goes away.
  CpuUpdatePool coordinator_{1};
  // The staged blocks' updates (their copies and the device's AdamW), beside the coordinator's.
  CpuUpdatePool stager_{1};
  CpuUpdatePool consumer_{1};  // after the coordinator and the stager: it submits to them
  DeviceThread device_thread_;
};

}  // namespace

BufferList gpu_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                DeviceKinds kinds, int micro_batches) {
  return PlannedSchedule::buffers(Mode::kGpu, layout, options, kinds, micro_batches);
}

std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout,
                                            const ScheduleOptions& options) {
  return std::make_unique<PlannedSchedule>(Mode::kGpu, std::move(backend), std::move(device),
                                           layout, options);
}

BufferList offload_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                    DeviceKinds kinds, int micro_batches) {
  return PlannedSchedule::buffers(Mode::kOffload, layout, options, kinds, micro_batches);
}

std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout,
                                                const ScheduleOptions& options) {
  return std::make_unique<PlannedSchedule>(Mode::kOffload, std::move(backend), std::move(device),
                                           layout, options);
}

BufferList layup_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                  DeviceKinds kinds, int micro_batches) {
  return PlannedSchedule::buffers(Mode::kLayup, layout, options, kinds, micro_batches);
}

std::unique_ptr<Schedule> make_layup_schedule(std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& layout,
                                              const ScheduleOptions& options) {
  return std::make_unique<PlannedSchedule>(Mode::kLayup, std::move(backend), std::move(device),
                                           layout, options);
}

}  // namespace layup
