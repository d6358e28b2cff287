// A schedule decides where parameters, gradients and optimizer state live and in which order
// forward, backward and the AdamW update run. The trainer sees only this interface. What each mode
// keeps where, the order of a step, clipping, what a step leaves in flight and why the modes
// train bit for bit alike: docs/schedules.md.
//
// Tracing (trace/trace_recorder.h): with set_trace, a schedule records each step's work on the
// track "GPU" (the thread that issues device work; on the CPU backend, the host thread that plays
// the device) and its host-side work on the track "cpu workers" (each span there is one job of
// all the CPU workers together).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/model_backend.h"
#include "comm/communicator.h"
#include "core/run_choices.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"

namespace layup {

class TraceRecorder;

struct StepStats {
  float loss = 0.0f;         // mean over the micro-batches
  double grad_norm = 0.0;    // global L2 norm of the accumulated gradient, before clipping
  float clip_factor = 1.0f;  // what the gradient was multiplied by (1 = not clipped)
  // false when the loss or the norm was not finite: nothing changed (except in `layup` without
  // clipping, where blocks with a finite gradient were already updated; see mode_schedules.h).
  bool applied = false;
  // layup with speculative clipping, of the blocks updated on the host: those updated during
  // backward and updated again because the step was clipped, and those not updated during
  // backward because the norm of the blocks before them already called for clipping
  // (ScheduleOptions::speculative_clip).
  int blocks_redone = 0;
  int blocks_deferred = 0;
};

// What one update uses: the AdamW values at this step (lr from the schedule, t = update count)
// and the clip threshold (<= 0: no clipping).
struct UpdateSettings {
  AdamWStep adamw;
  float clip_max_norm = 1.0f;
};

// Parameters and AdamW moments in layout order: what a checkpoint holds.
struct OptimizerTensors {
  std::vector<float> params, adam_m, adam_v;
};

// One span's master weights and AdamW moments, each laid out like the span (Span::count floats).
// `coded`, where set, carries the moments instead, as the run's optimizer state kind keeps them
// (AdamWMoments::in_buffer's layout of the span, optimizer_moments_padded_bytes): bit for bit,
// which decoding to m and v and coding again is not in 8bit (a checkpoint, a resume). m and v
// are then not used.
struct SpanState {
  float* params;
  float* m;
  float* v;
  void* coded = nullptr;
};
struct ConstSpanState {
  const float* params;
  const float* m;
  const float* v;
  const void* coded = nullptr;
};

// The state a run starts from: parameters initialized from `seed` (model/init.h), zero moments.
OptimizerTensors fresh_optimizer_tensors(const ParameterLayout& layout, uint64_t seed);

// The disk tier's traffic, counted since it was made: whole records read ahead of their update
// (by its ring), read when the update asked for them (not read ahead in time), read ahead and then
// given up for another span (read again later: disk time spent for nothing), written back; and
// every byte read and written (export and import included).
struct DiskTraffic {
  size_t read_ahead = 0;
  size_t read_on_take = 0;
  size_t given_up = 0;
  size_t written_back = 0;
  size_t bytes_read = 0;
  size_t bytes_written = 0;

  DiskTraffic operator-(const DiskTraffic& before) const {
    return {read_ahead - before.read_ahead, read_on_take - before.read_on_take,
            given_up - before.given_up,     written_back - before.written_back,
            bytes_read - before.bytes_read, bytes_written - before.bytes_written};
  }
};

// An interface only: each schedule composes what it keeps (no state is shared down a hierarchy).
class Schedule {
 public:
  virtual ~Schedule() = default;

  virtual const ParameterLayout& layout() const = 0;

  virtual std::string name() const = 0;

  // One optimizer update from the gradient accumulated over all micro-batches (each weighted
  // 1/N). When the loss or gradient norm is not finite, nothing is updated (see StepStats).
  virtual StepStats step(std::span<const TokenBatch> micro_batches,
                         const UpdateSettings& settings) = 0;

  // Mean loss of a batch under the current parameters; changes nothing.
  virtual float evaluate(const TokenBatch& batch) = 0;

  // Logits of a batch ([B, T, padded_vocab], host memory, valid until the next call).
  virtual const float* forward_logits(const TokenBatch& batch) = 0;

  // Span `index`'s state out of wherever this schedule keeps it (the device, the host), and back
  // in. Both wait first for updates still in flight. Span by span, a model's state is never whole
  // on the host (initialize_fresh, checkpoints of big models). export_span skips a null part of
  // `out` (a checkpoint pass that writes only the weights, or only one moment).
  virtual void export_span(size_t index, const SpanState& out) const = 0;
  virtual void import_span(size_t index, const ConstSpanState& in) = 0;
  // The kind its moments are kept in (ScheduleOptions::optimizer_state): what SpanState::coded
  // holds.
  virtual OptimizerStateKind optimizer_state() const = 0;
  // Where the optimizer state is split across ranks (ZeRO-1), rank 0's export_span asks the
  // other ranks for what they own: while rank 0 exports (a checkpoint), every other rank calls
  // serve_exports, which answers until rank 0 calls end_exports. Every rank imports every span
  // and keeps its part. Nothing to do where each rank holds the whole state.
  virtual void serve_exports() {}
  virtual void end_exports() {}

  // The whole model's state, through export_span and import_span: 12 bytes a parameter on the
  // host, for models that fit there.
  OptimizerTensors export_tensors() const;
  void import_tensors(const OptimizerTensors& tensors);
  // The state a run starts from (fresh_optimizer_tensors), span by span: one span's worth of host
  // memory. `spans_done` (may be empty) hears after each span how many of how many are in: a 13B
  // model's fresh state takes a minute or more.
  void initialize_fresh(uint64_t seed, const std::function<void(size_t, size_t)>& spans_done = {});

  // Records the spans of every later step into `recorder` (null: stop), on the track "GPU"
  // (device_track) and tracks of the schedule's own. Call between steps; the recorder must
  // outlive the steps it records (a schedule whose updates run past the end of a step waits for
  // them here).
  virtual void set_trace(TraceRecorder* recorder) = 0;

  // One line on the CPU AdamW engine and the rate it reached so far (HostAdamW::report(), e.g.
  // "CPU AdamW: 16 workers (pinned), AVX-512, 3.41 G params/s over 120 updates"); "" for a mode
  // that runs AdamW on the device.
  virtual std::string cpu_adamw_report() const { return ""; }
  // offload, layup: the CPU AdamW rate so far in parameters/s (0 for gpu, or before any update).
  virtual double cpu_adamw_rate() const { return 0.0; }
  // One line on where state lives outside memory (layup's disk tier: its file, its I/O mode, its
  // staging slots); "" where nothing does.
  virtual std::string storage_report() const { return ""; }
  // What the disk tier has moved so far (zeros where there is none): a difference of two
  // readings is what the steps between them moved.
  virtual DiskTraffic disk_traffic() const { return {}; }
};

// The track "GPU" of `recorder` (0 without one): where every schedule records its device work.
int device_track(TraceRecorder* recorder);

// Where a span's AdamW runs and its AdamW state lives (ScheduleOptions::update_sites): the
// device's memory and AdamW; the host's memory and CPU workers; a file under
// ScheduleOptions::offload_dir, staged through host memory for the CPU workers (blocks only); or
// the host's memory, staged through a slot in the device's memory for the device's AdamW
// (kStaged, StagedTier, staged_tier.h; blocks only).
enum class UpdateSite { kHost, kDevice, kDisk, kStaged };

// How `offload` and `layup` keep their host-side state; `gpu` ignores it. A run chooses it with its
// memory plan (schedule_plan.h), which sums the buffers these options make (schedule_buffers).
struct ScheduleOptions {
  int cpu_workers = 0;  // HostAdamW workers (0: one per core this process may use)
  // The device computes with the host's master weights where they lie, with no copy of its own
  // (docs/schedules.md, "Unified memory").
  bool weights_in_place = false;
  // layup: a whole-model fp32 gradient on the host, which clipping and accumulation need; without
  // it each block is updated from its slot and such a step is refused. offload always keeps it.
  bool host_gradient = true;
  // layup with clipping: speculate and redo (a second copy of the master weights and moments,
  // 12 bytes per parameter), else defer the block updates until the norm is known
  // (docs/schedules.md, "Clipping").
  bool speculative_clip = false;
  // layup: where each span's AdamW runs, in layout.spans() order (empty: every span on the host);
  // offload takes only its staged blocks (UpdateSite::kStaged), every other span on the host.
  // A span on the device (a block, the embeddings, the final norm) is updated by the device's
  // AdamW (Device::adamw_update_span) in the device copy of its weights, from its gradient kept in
  // device memory (summed there over micro-batches), with its moments in device memory; the host's
  // master weights and moments keep its part unused (a checkpoint reads the device's). Needs a
  // device copy (not weights_in_place). See docs/schedules.md.
  std::vector<UpdateSite> update_sites{};
  // layup on a backend that computes with a bf16 copy of the weights (ModelBackend::compute_copy):
  // the device keeps an fp32 copy of the device-updated spans only (their master weights); a
  // host-updated span's new weights land in the compute copy, cast on arrival
  // (Device::copy_to_compute_copy_async), and device-updated spans write theirs in their AdamW
  // pass, so no forward casts. Saves 4 bytes a host-updated parameter of device memory.
  bool weights_land_in_compute_copy = false;
  // layup, spans at UpdateSite::kDisk: the directory of their file (DiskTier, disk_tier.h) and
  // the staging slots in host memory their updates go through (read ahead, written back).
  std::string offload_dir{};
  int disk_slots = 3;
  // offload and layup, spans at UpdateSite::kStaged: the slots in device memory their updates go
  // through (a block's gradient and state copied in, updated, copied back): two let one block's
  // copies in run beside the last one's AdamW and copies back.
  int staging_slots = 2;
  // The most elements of a block one staging slot holds (a multiple of 256); 0:
  // StagedTier::kStagingPartElements. Tests set it small to update blocks in several parts.
  size_t staging_part_elements = 0;
  // Where each class's primary tensors live (the run's placement, memory/memory_plan.h, which
  // --place overrides): the master weights, moments and gradients of every mode, and the device
  // copy of the weights in offload and layup. A class without a kind takes the device's default:
  // its own memory on the device side, pinned master weights and plain host moments on the host
  // side (the CPU backend: host memory throughout).
  std::array<std::optional<MemoryKind>, kTensorClassCount> placement{};
  // Data parallel (docs/parallel.md): the ranks whose gradients each step sums, every rank
  // stepping on its own micro-batches of the global batch; null or one rank: this process alone.
  // Every mode; offload and layup sum the CPU-updated spans span by span on the host (layup: as
  // each block's backward ends, on its gradient consumer), layup's device-updated spans where they
  // are. Not owned.
  Communicator* ranks = nullptr;
  // Without `ranks` (a run planned, not started: `layup memory --ranks N`), the rank count whose
  // sums the step plan lists; `ranks`, where given, decides.
  int planned_ranks = 1;
  // The ranks the moments of the device-updated spans (gpu mode: every span) are split across
  // and of the host-updated ones (ZeRO-1: each rank keeps and updates its part of each,
  // schedule/optimizer_shards.h; every mode on the CPU backend, gpu mode on GPUs); 1: every rank
  // keeps them whole. The count is known when the run is planned,
  // the communicator only when it is built: both must agree.
  int optimizer_shards = 1;
  // How AdamW keeps its moments in every mode and tier (--optimizer-state;
  // docs/optimizer_state.md): fp32, or bf16 or blockwise 8-bit, which are lossy.
  OptimizerStateKind optimizer_state = OptimizerStateKind::kFp32;
  // offload and layup with several micro-batches (--accumulate; docs/schedules.md, "Micro-batch
  // accumulation"): layer-major runs the forward span by span over every micro-batch, each one's
  // residual stream in a hidden state of hidden_state_bytes on the device between its blocks
  // (ModelBackend::forward_block), keeps each one's block inputs in a store of
  // micro_batch_state_bytes (ModelBackend::micro_batch_state_bytes) in host memory, and sums
  // each block's gradient over the micro-batches on the device, so the host gets one gradient a
  // block and sums only the head's (without host_gradient it keeps no other gradient). The same
  // bits either way.
  Accumulation accumulation = Accumulation::kMicroBatchMajor;
  size_t micro_batch_state_bytes = 0;  // what the memory plan counts per micro-batch
  size_t hidden_state_bytes = 0;       // likewise
  // offload and layup (docs/memory.md, "Streamed weights"): the last streamed_blocks blocks the
  // host updates keep no compute copy on the device; each computes from slot layer % stream_slots
  // of a ring, filled from the host before its forward and its backward (the step plan's "weights
  // in" tasks, WeightRing). 0: every block's weights stay on the device.
  int streamed_blocks = 0;
  int stream_slots = 2;

  // The kind placement gives `tensor_class`, else `fallback`.
  MemoryKind kind_of(TensorClass tensor_class, MemoryKind fallback) const {
    return placement[index_of(tensor_class)].value_or(fallback);
  }
};

// A schedule's buffer of `count` floats of `tensor_class` on `side`, where options.placement puts
// the class, else the default of a device handing out `kinds` (see ScheduleOptions::placement).
PlannedAllocation placed_buffer(const ScheduleOptions& options, DeviceKinds kinds, size_t count,
                                TensorClass tensor_class, MemorySide side, std::string what);

// Every buffer the schedule of `mode` allocates with `options` on a device handing out `kinds`:
// what its constructor allocates, and, with micro_batches > 1, what it allocates at the first
// step of several micro-batches. The memory plan sums this list; each part is listed by the
// component that allocates it.
BufferList schedule_buffers(Mode mode, const ParameterLayout& layout,
                            const ScheduleOptions& options, DeviceKinds kinds, int micro_batches);

// The update sites of a discrete GPU's default (schedule_plan.h): the embeddings and
// the final norm on the device, every block on the host.
std::vector<UpdateSite> head_on_device(const ParameterLayout& layout);

// The sums over `ranks` of gradients in the device's memory: in a GPU's own memory the device's
// collectives (NCCL), rank 0's id handed on by MPI; where the device's memory is the host's, the
// communicator itself. Every rank calls it at the same point.
std::unique_ptr<DeviceCollectives> join_device_collectives(Device& device, Communicator& ranks);

// The schedule of a mode (what each does: mode_schedules.h, docs/schedules.md); of `options`,
// gpu uses its placement, ranks and optimizer shards.
std::unique_ptr<Schedule> make_schedule(Mode mode, std::unique_ptr<ModelBackend> backend,
                                        std::unique_ptr<Device> device,
                                        const ParameterLayout& layout,
                                        const ScheduleOptions& options = {});

// One line for logs and reports: what the mode does, with these options (CPU workers, 0: one per
// core; speculative clipping) and this clip threshold (<= 0: none); for `layup`, how clipping is
// honoured and what a non-finite gradient does; then the optimizer state kind
// (describe_optimizer_state).
std::string describe_schedule(Mode mode, const ScheduleOptions& options, float clip_max_norm);
// "optimizer state: 8bit (blockwise 8-bit moments, lossy; docs/optimizer_state.md)": the kind, and
// that a compact one is lossy.
std::string describe_optimizer_state(OptimizerStateKind kind);

}  // namespace layup
