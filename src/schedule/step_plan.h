// One training step as a plan: every task of every span (forward, backward, the gradient's way to
// the host, the norm, AdamW on the device, the host or the disk, the weights landing), the lane
// that runs it and what it waits for. Compiled once from the mode and the schedule's options; the
// schedules run it, the step-time model simulates it, the memory plan lists its buffers, and
// `layup memory --explain` prints it. The lanes and the task kinds: docs/schedules.md, "The step
// as a plan".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/run_choices.h"
#include "memory/memory_plan.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {

// Who runs a task: the thread that issues the device's work (the device itself, in order); the
// link each way; the host's CPU workers (gradient adds and AdamW); the disk; step() itself (the
// norm, once every sum of squares is in); the staging thread, which issues the staged blocks'
// AdamW on the device beside the device thread's work (UpdateSite::kStaged); and the link between
// the ranks, which sums each span's gradient over them in the lane's order, the same on every rank
// (the consumer's thread calls MPI; on CUDA it issues NCCL on a stream of its own).
enum class Lane : uint8_t { kDevice, kToHost, kCpu, kToDevice, kDisk, kStep, kStaging, kRanks };
inline constexpr int kLaneCount = 8;
const char* name_of(Lane lane);

enum class TaskKind : uint8_t {
  kForward,         // a span's forward of one micro-batch (the final norm's: the LM head and loss)
  kBackward,        // a span's backward of one micro-batch (the final norm's: backward_head)
  kGradientToHost,  // one micro-batch's gradient of a span copied to the host
  kAddGradient,     // a later micro-batch's gradient added into the span's sum
  kSumOverRanks,    // the span's gradient summed over the ranks (ZeRO-1: into this rank's part)
  kNorm,            // the global norm and the clip factor known
  kReadState,       // a disk span's master weights and moments read into a staging slot; a staged
               // span's gradient, master weights and moments copied into its slot on the device
  kAdamW,       // the span's update, on the device or the CPU workers
  kWriteState,  // a disk span's new state written back; a staged span's copied back to the host
  kWeightsToDevice,  // the span's new weights landing in the device's copy
  kWeightsIn,        // a streamed block's weights filled into its ring slot for the device to read
};
const char* name_of(TaskKind kind);
// A task's name in traces and in StepPlan::describe(), the block's layer left to the caller
// (TraceSpan appends it): "backward_block", "adamw block", "weights final_norm", "backward_head".
const char* trace_name(TaskKind kind, SpanKind span);

// Where a span's backward writes its gradient: one of the two slots the host takes blocks' from
// (layup), the span's own buffer (the head, device-updated spans), or its part of the
// whole-model gradient (gpu, offload).
enum class GradientTarget : uint8_t { kSlot, kOwnBuffer, kWholeGradient };
const char* name_of(GradientTarget target);

// When the host-updated spans are updated: as each gradient lands during backward (no clipping;
// speculative clipping, redone when the step is clipped), or once the norm is known.
enum class UpdateWindow : uint8_t { kDuringBackward, kAfterNorm };

struct PlanTask {
  TaskKind kind;
  Lane lane;
  int span = -1;                     // index in ParameterLayout::spans(); -1 for the norm
  int micro_batch = -1;              // -1: once a step
  std::vector<int> after;            // tasks of the same step it waits for (their indices)
  std::vector<int> after_last_step;  // tasks of the step before it waits for
};

// Per span, what the plan decided.
struct SpanPlan {
  UpdateSite site = UpdateSite::kHost;
  GradientTarget gradient = GradientTarget::kSlot;
  // Its weights stay on the host and are filled into ring slot layer % stream_slots before each
  // forward and backward that does not find them there (ScheduleOptions::streamed_blocks).
  bool streamed = false;
};

struct StepPlan {
  Mode mode = Mode::kGpu;
  int micro_batches = 1;
  int ranks = 1;
  UpdateWindow window = UpdateWindow::kAfterNorm;
  bool speculative = false;  // updates during backward are redone when the step is clipped
  // The host keeps a whole gradient of its spans (micro-batch-major: the sum it adds into).
  bool host_gradient = false;
  // Layer-major (offload, layup; several micro-batches): the device sums every span's
  // micro-batches and the host gets each span's sum in one copy; else the host sums them.
  Accumulation accumulation = Accumulation::kMicroBatchMajor;
  // The step returns once every span's new weights are on the device (offload: nothing of a step
  // runs beside the next), else the next forward waits for each span's.
  bool weights_before_return = false;
  int disk_slots = 0;           // staging slots the disk's reads run ahead by
  int staging_slots = 0;        // the staged spans' slots on the device (0: none is staged)
  int stream_slots = 0;         // the weight ring's slots (0: no span is streamed)
  std::vector<SpanPlan> spans;  // layout order
  // In the order a run issues them: each lane runs its own in this order. A task comes after
  // every task it waits for in the same step.
  std::vector<PlanTask> tasks;
  BufferList buffers;  // what the schedule running this plan allocates

  // The task's name in traces and in describe(): "backward block 3", "adamw embeddings" ...
  std::string task_name(const PlanTask& task) const;
  // A few lines: the mode, per kind of span where its gradient goes and where it is updated, and
  // the order of one micro-batch on each lane.
  std::string describe() const;
  // How many tasks of `kind` run on `lane`.
  int count(TaskKind kind, Lane lane) const;
};

// The plan a schedule of `mode` with `options` runs for steps of `micro_batches`, clipping or not,
// on a device handing out `kinds`.
StepPlan compile_step_plan(Mode mode, const ParameterLayout& layout, const ScheduleOptions& options,
                           DeviceKinds kinds, int micro_batches, bool clipping);

}  // namespace layup
