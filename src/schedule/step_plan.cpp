// Compiles a mode and its options into the step's tasks (step_plan.h), in the order the schedules
// issue them, and prints them.
#include "schedule/step_plan.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>

#include "core/error.h"
#include "schedule/weight_ring.h"

namespace layup {

const char* name_of(Lane lane) {
  switch (lane) {
    case Lane::kDevice:
      return "device";
    case Lane::kToHost:
      return "to host";
    case Lane::kCpu:
      return "cpu workers";
    case Lane::kToDevice:
      return "to device";
    case Lane::kDisk:
      return "disk";
    case Lane::kStep:
      return "step";
    case Lane::kStaging:
      return "staging";
    case Lane::kRanks:
      return "ranks";
  }
  return "?";
}

const char* name_of(TaskKind kind) {
  switch (kind) {
    case TaskKind::kForward:
      return "forward";
    case TaskKind::kBackward:
      return "backward";
    case TaskKind::kGradientToHost:
      return "gradient to host";
    case TaskKind::kAddGradient:
      return "add gradient";
    case TaskKind::kSumOverRanks:
      return "sum over ranks";
    case TaskKind::kNorm:
      return "norm";
    case TaskKind::kReadState:
      return "read state";
    case TaskKind::kAdamW:
      return "adamw";
    case TaskKind::kWriteState:
      return "write state";
    case TaskKind::kWeightsToDevice:
      return "weights";
    case TaskKind::kWeightsIn:
      return "weights in";
  }
  return "?";
}

const char* name_of(GradientTarget target) {
  switch (target) {
    case GradientTarget::kSlot:
      return "a slot";
    case GradientTarget::kOwnBuffer:
      return "its own buffer";
    case GradientTarget::kWholeGradient:
      return "the whole-model gradient";
  }
  return "?";
}

const char* trace_name(TaskKind kind, SpanKind span) {
  // Literals: a TraceSpan keeps the pointer. The backward's three calls keep the names of the
  // backend's functions.
  static constexpr const char* kNames[][3] = {
      {"forward embeddings", "forward block", "forward final_norm"},
      {"backward_embeddings", "backward_block", "backward_head"},
      {"gradient to host embeddings", "gradient to host block", "gradient to host final_norm"},
      {"add gradient embeddings", "add gradient block", "add gradient final_norm"},
      {"sum over ranks embeddings", "sum over ranks block", "sum over ranks final_norm"},
      {"norm", "norm", "norm"},
      {"read state embeddings", "read state block", "read state final_norm"},
      {"adamw embeddings", "adamw block", "adamw final_norm"},
      {"write state embeddings", "write state block", "write state final_norm"},
      {"weights embeddings", "weights block", "weights final_norm"},
      {"weights in embeddings", "weights in block", "weights in final_norm"}};
  static_assert(std::size(kNames) == static_cast<size_t>(TaskKind::kWeightsIn) + 1,
                "a row of names per task kind, in TaskKind's order");
  const int column = span == SpanKind::kEmbeddings ? 0 : span == SpanKind::kBlock ? 1 : 2;
  return kNames[static_cast<int>(kind)][column];
}

namespace {

const char* site_name(UpdateSite site) {
  switch (site) {
    case UpdateSite::kDevice:
      return "AdamW on the device";
    case UpdateSite::kHost:
      return "AdamW on the host";
    case UpdateSite::kDisk:
      return "AdamW on the host, its state on disk,";
    case UpdateSite::kStaged:
      return "AdamW on the device, its state on the host staged through a slot,";
  }
  return "?";
}

// Builds one step's task list; cross-step waits are added once the whole step is known.
class PlanBuilder {
 public:
  PlanBuilder(StepPlan& plan, int layers)
      : plan_(plan),
        spans_(static_cast<int>(plan.spans.size())),
        layers_(layers),
        on_host_(plan.spans.size(), -1),
        landed_(plan.spans.size(), -1),
        summed_(plan.spans.size(), -1) {
    head_copy_[0] = head_copy_[spans_ - 1] = -1;
  }

  void build() {
    disk_order();
    for (size_t j = 0; j < std::min(disk_.size(), static_cast<size_t>(plan_.disk_slots)); ++j)
      disk_read_[disk_[j]] = add(TaskKind::kReadState, Lane::kDisk, disk_[j], -1, {});
    if (plan_.accumulation == Accumulation::kLayerMajor) {
      layer_major();
      finish_step();
      cross_step_waits();
      return;
    }
    int after_copies = -1;  // offload: the last copy of the micro-batch before
    for (int k = 0; k < plan_.micro_batches; ++k) {
      const bool last = k + 1 == plan_.micro_batches;
      for (int i = 0; i < spans_; ++i) {
        const int task = add(TaskKind::kForward, Lane::kDevice, i, k, {});
        if (after_copies >= 0 && i == 0) plan_.tasks[task].after.push_back(after_copies);
        if (k == 0) first_forward_.push_back(task);
      }
      backward_head(k);
      for (int layer = layers_ - 1; layer >= 0; --layer) backward_block(1 + layer, k, last);
      const int embeddings = add(TaskKind::kBackward, Lane::kDevice, 0, k, {});
      last_backward_ = embeddings;
      if (plan_.mode == Mode::kOffload) {
        after_copies = copy_everything(embeddings, k);
        continue;
      }
      for (const int i : {0, spans_ - 1}) gradient_path(i, embeddings, k);
    }
    finish_step();
    cross_step_waits();
  }

 private:
  bool layup() const { return plan_.mode == Mode::kLayup; }
  bool on_cpu_side(int span) const { return plan_.spans[span].site != UpdateSite::kDevice; }
  // Whether the device adds micro-batch k's gradient into a sum: gpu sums every micro-batch from
  // +0 (one sum for the whole model), the device-updated spans of layup every one after the first.
  bool device_adds(int k) const {
    return plan_.mode == Mode::kGpu ? plan_.micro_batches > 1 : k > 0;
  }

  int add(TaskKind kind, Lane lane, int span, int micro_batch, std::vector<int> after) {
    const bool reads_weights =
        lane == Lane::kDevice && (kind == TaskKind::kForward || kind == TaskKind::kBackward);
    const bool streamed = reads_weights && span >= 0 && plan_.spans[span].streamed;
    const int slot = streamed ? (span - 1) % plan_.stream_slots : -1;
    if (streamed && (slot_holds_.count(slot) == 0 || slot_holds_[slot] != span))
      after.push_back(weights_in(span, slot, micro_batch));
    plan_.tasks.push_back({kind, lane, span, micro_batch, std::move(after), {}});
    const int task = last_task();
    if (streamed) slot_reader_[slot] = task;
    return task;
  }

  // A streamed block's weights into its slot, once the device has run the slot's last reader (in
  // the first fill of a step: the reader of the step before, and the block's update of the step
  // before on the host, cross_step_waits). Returns the fill.
  int weights_in(int span, int slot, int micro_batch) {
    std::vector<int> after;
    if (const auto reader = slot_reader_.find(slot); reader != slot_reader_.end())
      after.push_back(reader->second);
    plan_.tasks.push_back(
        {TaskKind::kWeightsIn, Lane::kToDevice, span, micro_batch, std::move(after), {}});
    const int fill = last_task();
    if (first_slot_fill_.count(slot) == 0) first_slot_fill_[slot] = fill;
    if (first_fill_.count(span) == 0) first_fill_[span] = fill;
    slot_holds_[slot] = span;
    return fill;
  }

  // The disk spans in the order they are updated: as backward reaches them (top down), or after
  // the norm (bottom up).
  void disk_order() {
    for (int i = 0; i < spans_; ++i)
      if (plan_.spans[i].site == UpdateSite::kDisk) disk_.push_back(i);
    if (plan_.window == UpdateWindow::kDuringBackward) std::reverse(disk_.begin(), disk_.end());
  }

  // Layer-major: the forward span by span, each span's of every micro-batch in turn (so a span's
  // forward waits only for its own update of the step before, and a streamed block is filled once
  // for it); each micro-batch's loss and head backward; then each block's backward of every
  // micro-batch in turn, each added into the block's sum on the device, the sum handed to the host
  // once; the embeddings' backward of every micro-batch last, then the head's sums.
  void layer_major() {
    const int final_norm = spans_ - 1;
    for (int i = 0; i < final_norm; ++i)
      for (int k = 0; k < plan_.micro_batches; ++k) {
        const int task = add(TaskKind::kForward, Lane::kDevice, i, k, {});
        if (k == 0) first_forward_.push_back(task);
      }
    for (int k = 0; k < plan_.micro_batches; ++k) {
      const int task = add(TaskKind::kForward, Lane::kDevice, final_norm, k, {});
      if (k == 0) first_forward_.push_back(task);
      backward_head(k);
      head_path(final_norm, last_task(), k);
    }
    for (int layer = layers_ - 1; layer >= 0; --layer) {
      const int span = 1 + layer;
      const bool slot = plan_.spans[span].gradient == GradientTarget::kSlot;
      // The sum is taken in slot layer % 2, free once the host has the block two above; the
      // later micro-batches are written into the other slot, free once it has the block above,
      // and added.
      int summed = -1;
      for (int k = 0; k < plan_.micro_batches; ++k) {
        const int acquired = !slot ? -1 : k == 0 ? layer % 2 : k == 1 ? (layer + 1) % 2 : -1;
        std::vector<int> after;
        if (acquired >= 0 && slot_user_[acquired] >= 0) after.push_back(slot_user_[acquired]);
        const int task = add(TaskKind::kBackward, Lane::kDevice, span, k, std::move(after));
        if (acquired >= 0 && slot_user_[acquired] < 0 && first_slot_backward_[acquired] < 0)
          first_slot_backward_[acquired] = task;
        summed =
            slot && k == 0 ? task : add(TaskKind::kAddGradient, Lane::kDevice, span, k, {task});
      }
      if (!on_cpu_side(span)) sum_where_it_lies(span, summed);
      if (plan_.mode == Mode::kOffload || !on_cpu_side(span)) continue;
      const int copy = sum_to_host(span, summed);
      if (slot) slot_user_[layer % 2] = copy;
      if (plan_.window == UpdateWindow::kDuringBackward) update(span, {on_host_[span]});
    }
    for (int k = 0; k < plan_.micro_batches; ++k) {
      last_backward_ = add(TaskKind::kBackward, Lane::kDevice, 0, k, {});
      head_path(0, last_backward_, k);
    }
    if (plan_.mode == Mode::kOffload) {
      // The blocks' sums in forward order, one after the other, as offload copies.
      int previous = last_backward_;
      for (int i = 1; i < final_norm; ++i) previous = sum_to_host(i, previous);
    }
  }

  // Layer-major: a head span's gradient of micro-batch k, as micro-batch-major sums it: added
  // into the device tier's sum, or to the host and added there after the first.
  void head_path(int span, int computed, int k) {
    if (!on_cpu_side(span)) {
      const int added = add(TaskKind::kAddGradient, Lane::kDevice, span, k, {computed});
      if (k + 1 == plan_.micro_batches) sum_where_it_lies(span, added);
      return;
    }
    const int copy = add(TaskKind::kGradientToHost, Lane::kToHost, span, k, {computed});
    on_host_[span] = head_copy_[span] = copy;
    if (k > 0) on_host_[span] = add(TaskKind::kAddGradient, Lane::kCpu, span, k, {copy});
    if (k + 1 == plan_.micro_batches && plan_.ranks > 1)
      on_host_[span] = add(TaskKind::kSumOverRanks, Lane::kRanks, span, -1, {on_host_[span]});
  }

  // Layer-major: span `span`'s sum over the micro-batches to the host in one copy once `summed`
  // is done, summed over the ranks after. Returns the copy.
  int sum_to_host(int span, int summed) {
    const int copy = add(TaskKind::kGradientToHost, Lane::kToHost, span, -1, {summed});
    on_host_[span] = copy;
    if (span == 0 || span == spans_ - 1) head_copy_[span] = copy;
    if (plan_.ranks > 1)
      on_host_[span] = add(TaskKind::kSumOverRanks, Lane::kRanks, span, -1, {copy});
    return copy;
  }

  // A device-updated span's gradient, final once `final` is done (its last micro-batch's backward
  // or add), summed over the ranks where it lies, on the ranks' lane while the device computes the
  // spans below: the norm and the span's AdamW wait for it.
  void sum_where_it_lies(int span, int final) {
    if (plan_.ranks > 1)
      summed_[span] = add(TaskKind::kSumOverRanks, Lane::kRanks, span, -1, {final});
  }

  int last_task() const { return static_cast<int>(plan_.tasks.size()) - 1; }

  // backward_head: the final norm's (and the LM head's) backward, which also starts the
  // embeddings' gradient. In layup it overwrites the head's gradient buffers: the host must have
  // taken the micro-batch before's.
  void backward_head(int k) {
    std::vector<int> after;
    if ((layup() || plan_.accumulation == Accumulation::kLayerMajor) && k > 0)
      for (const int i : {0, spans_ - 1})
        if (head_copy_[i] >= 0) after.push_back(head_copy_[i]);
    const int task = add(TaskKind::kBackward, Lane::kDevice, spans_ - 1, k, std::move(after));
    if (k == 0) first_backward_head_ = task;
  }

  void backward_block(int span, int k, bool last) {
    const SpanPlan& s = plan_.spans[span];
    if (s.gradient != GradientTarget::kSlot) {
      // gpu and the device-updated spans sum micro-batches on the device; offload copies after.
      int task = add(TaskKind::kBackward, Lane::kDevice, span, k, {});
      if (on_cpu_side(span)) return;
      if (device_adds(k)) task = add(TaskKind::kAddGradient, Lane::kDevice, span, k, {task});
      if (last) sum_where_it_lies(span, task);
      return;
    }
    // Slot (layer % 2) is free once the host has its last gradient.
    const int slot = (span - 1) % 2;
    std::vector<int> after;
    if (slot_user_[slot] >= 0) after.push_back(slot_user_[slot]);
    const int task = add(TaskKind::kBackward, Lane::kDevice, span, k, std::move(after));
    if (slot_user_[slot] < 0) first_slot_backward_[slot] = task;
    const int copied = gradient_path(span, task, k);
    slot_user_[slot] = copied;
    if (last && plan_.window == UpdateWindow::kDuringBackward) update(span, {on_host_[span]});
  }

  // A host-updated span's gradient of micro-batch k: to the host, added to the sum after the
  // first, summed over the ranks after the last. Returns the copy (what frees its buffer).
  int gradient_path(int span, int computed, int k) {
    if (!on_cpu_side(span)) {
      const int final = device_adds(k)
                            ? add(TaskKind::kAddGradient, Lane::kDevice, span, k, {computed})
                            : computed;
      if (k + 1 == plan_.micro_batches) sum_where_it_lies(span, final);
      return -1;
    }
    const int copy = add(TaskKind::kGradientToHost, Lane::kToHost, span, k, {computed});
    on_host_[span] = copy;
    if (span == 0 || span == spans_ - 1) head_copy_[span] = copy;
    if (k > 0 && plan_.host_gradient)
      on_host_[span] = add(TaskKind::kAddGradient, Lane::kCpu, span, k, {copy});
    if (k + 1 == plan_.micro_batches && plan_.ranks > 1)
      on_host_[span] = add(TaskKind::kSumOverRanks, Lane::kRanks, span, -1, {on_host_[span]});
    return copy;
  }

  // offload: after backward, every span's gradient copied (added, and after the last micro-batch
  // summed over the ranks), the head's first, then the blocks' in forward order, one after the
  // other, nothing beside them. Returns the last task.
  int copy_everything(int backward_done, int k) {
    int previous = backward_done;
    std::vector<int> order = {0, spans_ - 1};
    for (int i = 1; i < spans_ - 1; ++i) order.push_back(i);
    for (const int i : order) {
      previous = add(TaskKind::kGradientToHost, Lane::kToHost, i, k, {previous});
      if (k > 0) previous = add(TaskKind::kAddGradient, Lane::kCpu, i, k, {previous});
      if (k + 1 == plan_.micro_batches && plan_.ranks > 1)
        previous = add(TaskKind::kSumOverRanks, Lane::kRanks, i, -1, {previous});
      on_host_[i] = previous;
    }
    return previous;
  }

  // The norm, then the updates the window left; the device's in layout order after the host's
  // are queued (they run before the next forward, in the device's order).
  void finish_step() {
    std::vector<int> after = {last_backward_};
    for (int i = 0; i < spans_; ++i)
      if (summed_[i] >= 0) after.push_back(summed_[i]);
    // Layer-major: the host sums the head's micro-batches (its spans the host updates).
    const bool host_sums = plan_.mode == Mode::kOffload ||
                           (plan_.host_gradient && plan_.micro_batches > 1) ||
                           plan_.accumulation == Accumulation::kLayerMajor || plan_.ranks > 1;
    if (host_sums)
      for (int i = 0; i < spans_; ++i)
        if (on_host_[i] >= 0) after.push_back(on_host_[i]);
    norm_ = add(TaskKind::kNorm, Lane::kStep, -1, -1, std::move(after));
    // The head's first (the next forward reads the embeddings first; the executor runs the head's
    // update ahead of queued blocks' once its gradient is in), then the blocks the window left.
    std::vector<int> order = {0, spans_ - 1};
    if (plan_.window == UpdateWindow::kAfterNorm)
      for (int i = 1; i < spans_ - 1; ++i) order.push_back(i);
    for (const int i : order)
      if (on_cpu_side(i)) update(i, {norm_, on_host_[i]});
    for (int i = 0; i < spans_; ++i) {
      if (on_cpu_side(i)) continue;
      std::vector<int> adamw_after = {norm_};
      if (summed_[i] >= 0) adamw_after.push_back(summed_[i]);
      landed_[i] = add(TaskKind::kAdamW, Lane::kDevice, i, -1, std::move(adamw_after));
    }
  }

  // A host-updated span's AdamW on the CPU workers (its state read from disk first, written back
  // after), then its weights to the device; a staged span's gradient and state into a slot on the
  // device, the device's AdamW there, its state back.
  void update(int span, std::vector<int> after) {
    if (plan_.spans[span].site == UpdateSite::kStaged) return staged_update(span, std::move(after));
    const auto at = std::find(disk_.begin(), disk_.end(), span);
    const size_t j = static_cast<size_t>(at - disk_.begin());
    if (at != disk_.end()) after.push_back(disk_read_.at(span));
    const int adamw = add(TaskKind::kAdamW, Lane::kCpu, span, -1, std::move(after));
    // A streamed block's new weights stay on the host, where its next fill reads them.
    landed_[span] = plan_.spans[span].streamed
                        ? adamw
                        : add(TaskKind::kWeightsToDevice, Lane::kToDevice, span, -1, {adamw});
    if (at == disk_.end()) return;
    const int written = add(TaskKind::kWriteState, Lane::kDisk, span, -1, {adamw});
    // The staging slot it frees takes the read `slots` updates on.
    const size_t next = j + static_cast<size_t>(plan_.disk_slots);
    if (next < disk_.size())
      disk_read_[disk_[next]] = add(TaskKind::kReadState, Lane::kDisk, disk_[next], -1, {written});
  }

  // A staged span's update: its copies in take the slot the update staging_slots before it frees
  // once its state is back on the host (first in a step: one of the step before's), the staging
  // thread issues the device's AdamW once they have landed, and its state goes back. The new
  // weights are the device's from its AdamW on, and the span counts as landed once its state is
  // back.
  void staged_update(int span, std::vector<int> after) {
    const size_t j = staged_written_.size();
    const size_t slots = static_cast<size_t>(plan_.staging_slots);
    if (j >= slots) after.push_back(staged_written_[j - slots]);
    const int read = add(TaskKind::kReadState, Lane::kToDevice, span, -1, std::move(after));
    if (j < slots) staged_first_reads_.push_back(read);
    const int adamw = add(TaskKind::kAdamW, Lane::kStaging, span, -1, {read});
    const int written = add(TaskKind::kWriteState, Lane::kToHost, span, -1, {adamw});
    staged_written_.push_back(written);
    landed_[span] = written;
  }

  // What a step waits for from the one before: each span's forward for its new weights (offload:
  // the first forward for all of them, as its step returns once they have landed), the first for
  // step() to have returned; the head's backward and the first user of each slot for the host
  // to have taken the last micro-batch's gradient there.
  void cross_step_waits() {
    for (int i = 0; i < spans_; ++i) {
      std::vector<int>& waits =
          plan_.tasks[first_forward_[plan_.weights_before_return ? 0 : i]].after_last_step;
      if (landed_[i] >= 0) waits.push_back(landed_[i]);
    }
    plan_.tasks[first_forward_[0]].after_last_step.push_back(norm_);
    if (layup())
      for (const int i : {0, spans_ - 1})
        if (head_copy_[i] >= 0)
          plan_.tasks[first_backward_head_].after_last_step.push_back(head_copy_[i]);
    for (int slot = 0; slot < 2; ++slot)
      if (first_slot_backward_[slot] >= 0)
        plan_.tasks[first_slot_backward_[slot]].after_last_step.push_back(slot_user_[slot]);
    // A streamed block's first fill of a step reads its new weights on the host; a ring slot's
    // first fill waits for the device to have read the slot last in the step before.
    for (const auto& [span, fill] : first_fill_)
      if (landed_[span] >= 0) plan_.tasks[fill].after_last_step.push_back(landed_[span]);
    for (const auto& [slot, fill] : first_slot_fill_)
      plan_.tasks[fill].after_last_step.push_back(slot_reader_[slot]);
    // The staging slots go round from one step to the next.
    const size_t staged = staged_written_.size();
    for (size_t j = 0; j < staged_first_reads_.size(); ++j)
      if (staged + j >= static_cast<size_t>(plan_.staging_slots))
        plan_.tasks[staged_first_reads_[j]].after_last_step.push_back(
            staged_written_[staged + j - static_cast<size_t>(plan_.staging_slots)]);
  }

  StepPlan& plan_;
  const int spans_, layers_;
  std::vector<int> on_host_;  // per span: the last task of its gradient's way to the host
  std::vector<int> landed_;   // per span: the task after which its new weights are on the device
  std::vector<int> summed_;   // per device-updated span: its sum over the ranks (-1: none)
  std::vector<int> first_forward_;
  std::map<int, int> head_copy_;          // per head span: its last copy to the host
  std::array<int, 2> slot_user_{-1, -1};  // per slot: the copy that last read it
  std::array<int, 2> first_slot_backward_{-1, -1};
  std::vector<int> disk_;         // disk spans in update order
  std::map<int, int> disk_read_;  // per disk span: its read
  // The staged spans' copies back, in update order, and the first staging_slots copies in.
  std::vector<int> staged_written_, staged_first_reads_;
  // Per ring slot: the streamed span it holds in this step (none at the start of a step: the
  // block's weights of the step before are stale), and the device task that last read it.
  std::map<int, int> slot_holds_, slot_reader_;
  std::map<int, int> first_fill_, first_slot_fill_;  // per streamed span, per slot: its first fill
  int first_backward_head_ = -1, last_backward_ = -1, norm_ = -1;
};

}  // namespace

StepPlan compile_step_plan(Mode mode, const ParameterLayout& layout, const ScheduleOptions& options,
                           DeviceKinds kinds, int micro_batches, bool clipping) {
  LAYUP_CHECK(micro_batches >= 1, "a step plan needs at least one micro-batch (got ", micro_batches,
              ")");
  const size_t span_count = layout.spans().size();
  LAYUP_CHECK(options.update_sites.empty() || options.update_sites.size() == span_count,
              "a step plan got ", options.update_sites.size(), " update sites for ", span_count,
              " spans (embeddings, ", layout.config().n_layer, " blocks, final norm)");
  StepPlan plan;
  plan.mode = mode;
  plan.micro_batches = micro_batches;
  plan.ranks = options.ranks != nullptr ? options.ranks->size() : options.planned_ranks;
  plan.spans.resize(span_count);
  for (size_t i = 0; i < span_count; ++i) {
    SpanPlan& s = plan.spans[i];
    const bool head = i == 0 || i + 1 == span_count;
    switch (mode) {
      case Mode::kGpu:
        s = {UpdateSite::kDevice, GradientTarget::kWholeGradient};
        break;
      case Mode::kOffload:  // every span on the host but the staged blocks
        s = {!options.update_sites.empty() && options.update_sites[i] == UpdateSite::kStaged
                 ? UpdateSite::kStaged
                 : UpdateSite::kHost,
             GradientTarget::kWholeGradient};
        break;
      case Mode::kLayup:
        s.site = options.update_sites.empty() ? UpdateSite::kHost : options.update_sites[i];
        s.gradient = head || s.site == UpdateSite::kDevice ? GradientTarget::kOwnBuffer
                                                           : GradientTarget::kSlot;
        break;
    }
    if (s.site == UpdateSite::kDisk) plan.disk_slots = options.disk_slots;
    if (s.site == UpdateSite::kStaged) {
      LAYUP_CHECK(!head, "only blocks can be staged through the device, not the ",
                  i == 0 ? "embeddings" : "final norm");
      plan.staging_slots = std::max(1, options.staging_slots);
    }
  }
  if (options.streamed_blocks > 0) {
    LAYUP_CHECK(mode != Mode::kGpu,
                "gpu mode updates every block on the device, in place: it has no host copy of "
                "the weights to stream from; use --streamed-blocks 0, or offload or layup");
    std::vector<UpdateSite> sites;
    for (const SpanPlan& s : plan.spans) sites.push_back(s.site);
    const std::vector<char> streamed =
        WeightRing::streamed_spans(layout, sites, options.streamed_blocks);
    for (size_t i = 0; i < span_count; ++i) plan.spans[i].streamed = streamed[i] != 0;
    plan.stream_slots = WeightRing::slot_count(options);
  }
  plan.host_gradient = mode == Mode::kOffload || (mode == Mode::kLayup && options.host_gradient);
  if (mode != Mode::kGpu && micro_batches > 1) plan.accumulation = options.accumulation;
  plan.weights_before_return = mode == Mode::kOffload;
  plan.speculative = mode == Mode::kLayup && clipping && options.speculative_clip;
  plan.window = mode == Mode::kLayup && (!clipping || options.speculative_clip)
                    ? UpdateWindow::kDuringBackward
                    : UpdateWindow::kAfterNorm;
  PlanBuilder(plan, layout.config().n_layer).build();
  plan.buffers = schedule_buffers(mode, layout, options, kinds, micro_batches);
  return plan;
}

std::string StepPlan::task_name(const PlanTask& task) const {
  // The plan does not keep the layout: spans are named by their place in it.
  const int last = static_cast<int>(spans.size()) - 1;
  if (task.span < 0) return trace_name(task.kind, SpanKind::kBlock);
  if (task.span == 0) return trace_name(task.kind, SpanKind::kEmbeddings);
  if (task.span == last) return trace_name(task.kind, SpanKind::kFinalNorm);
  std::string name = trace_name(task.kind, SpanKind::kBlock);
  name += ' ';
  name += std::to_string(task.span - 1);
  return name;
}

int StepPlan::count(TaskKind kind, Lane lane) const {
  return static_cast<int>(std::count_if(tasks.begin(), tasks.end(), [&](const PlanTask& t) {
    return t.kind == kind && t.lane == lane;
  }));
}

std::string StepPlan::describe() const {
  std::string text = "step plan (" + std::string(name_of(mode)) + ", " +
                     std::to_string(micro_batches) + " micro-batch" +
                     (micro_batches > 1 ? "es" : "") + ", " + std::to_string(tasks.size()) +
                     " tasks)\n";
  // Spans grouped by what the plan does with them, in layout order.
  const int last = static_cast<int>(spans.size()) - 1;
  struct Group {
    int first, end;
  };
  std::vector<Group> groups;
  for (int i = 0; i <= last; ++i) {
    const bool same = !groups.empty() && i != last && groups.back().first != 0 &&
                      spans[i].site == spans[groups.back().first].site &&
                      spans[i].gradient == spans[groups.back().first].gradient &&
                      spans[i].streamed == spans[groups.back().first].streamed;
    if (same)
      groups.back().end = i + 1;
    else
      groups.push_back({i, i + 1});
  }
  const auto span_label = [&](int i) {
    return i == 0      ? std::string("embeddings")
           : i == last ? std::string("final_norm")
                       : "block " + std::to_string(i - 1);
  };
  for (const Group& g : groups) {
    std::string label = span_label(g.first);
    if (g.end - g.first > 1)
      label = "blocks " + std::to_string(g.first - 1) + "-" + std::to_string(g.end - 2);
    const SpanPlan& s = spans[g.first];
    text += "  " + label + ": gradient into " + name_of(s.gradient) + ", " + site_name(s.site);
    if (s.site != UpdateSite::kDevice)
      text += window == UpdateWindow::kDuringBackward && g.first != 0 && g.first != last
                  ? (speculative ? " during backward (redone if the step is clipped)"
                                 : " during backward")
                  : " after the norm";
    if (s.streamed)
      text += ", weights streamed through a ring of " + std::to_string(stream_slots) + " slot" +
              (stream_slots > 1 ? "s" : "");
    text += "\n";
  }
  // Each lane's tasks in order, those of the first micro-batch and those once a step; runs of
  // one kind over consecutive blocks in one item ("adamw blocks 11..0").
  if (accumulation == Accumulation::kLayerMajor)
    text +=
        "  layer-major: each span's forward of every micro-batch in turn, each micro-batch's "
        "loss and backward_head, then each block's backward of every micro-batch in turn, summed "
        "on the device and copied once\n";
  if (micro_batches > 1) text += "  each lane, the first micro-batch and the step's own tasks:\n";
  for (int lane = 0; lane < kLaneCount; ++lane) {
    std::vector<std::string> items;
    const PlanTask* run_first = nullptr;
    const PlanTask* run_last = nullptr;
    const auto close_run = [&] {
      if (run_first == nullptr) return;
      std::string name = task_name(*run_first);
      if (run_first != run_last)
        name.replace(name.rfind("block"), std::string::npos,
                     "blocks " + std::to_string(run_first->span - 1) + ".." +
                         std::to_string(run_last->span - 1));
      items.push_back(std::move(name));
      run_first = run_last = nullptr;
    };
    for (const PlanTask& task : tasks) {
      if (static_cast<int>(task.lane) != lane || task.micro_batch > 0) continue;
      const bool block = task.span > 0 && task.span < last;
      // A run goes up or down one block at a time.
      const int step = run_first != nullptr ? task.span - run_last->span : 0;
      const int direction = run_first != nullptr ? run_last->span - run_first->span : 0;
      const bool continues = run_first != nullptr && block && task.kind == run_last->kind &&
                             std::abs(step) == 1 &&
                             (direction == 0 || (step > 0) == (direction > 0));
      if (continues) {
        run_last = &task;
        continue;
      }
      close_run();
      if (block) {
        run_first = run_last = &task;
      } else {
        items.push_back(task_name(task));
      }
    }
    close_run();
    if (items.empty()) continue;
    std::string line;
    for (const std::string& item : items) line += (line.empty() ? "" : ", ") + item;
    char head[32];
    std::snprintf(head, sizeof head, "  %-12s ", name_of(static_cast<Lane>(lane)));
    text += head + line + "\n";
  }
  return text;
}

}  // namespace layup
