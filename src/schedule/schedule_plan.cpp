// The schedule's choices for a run (schedule_plan.h).
#include "schedule/schedule_plan.h"

#include <cstdio>
#include <string>

#include "core/error.h"
#include "model/parameter_layout.h"
#include "schedule/staged_tier.h"

namespace layup {

namespace {

// --accumulate auto: layer-major where the device has memory of its own behind a link, the run
// allows it (several micro-batches, one rank, every block's forward computed again) and it moves
// fewer bytes over the link a step. For each host-updated block, micro-batch-major sends the
// block's fp32 gradient once per micro-batch; layer-major sends it once, and at the block's
// backward moves each micro-batch's block input in and the residual stream's gradient out and in.
// On the CPU backend there is no link, and layer-major would compute each forward twice.
bool auto_picks_layer_major(const MemoryPlanRequest& r, bool cuda) {
  if (!cuda || r.attributes.integrated || r.mode == Mode::kGpu || r.grad_accum < 2 || r.ranks > 1 ||
      r.recompute < 3)
    return false;
  if (r.mode == Mode::kLayup && r.optimizer_placement.blocks_on_device() >= r.config.n_layer)
    return false;  // every block summed and updated on the device: nothing crosses the link
  const double micro_batches = r.grad_accum;
  const double block_params = static_cast<double>(ParameterLayout(r.config).block().count);
  const double activation_bytes = r.dtype == Dtype::kBf16 ? 2.0 : 4.0;
  const double rows_bytes =
      static_cast<double>(r.batch) * r.seq_len * r.config.n_embd * activation_bytes;
  return (micro_batches - 1.0) * 4.0 * block_params > 3.0 * micro_batches * rows_bytes;
}

}  // namespace

ScheduleOptions choose_schedule_options(const MemoryPlanRequest& r, const Placement& placement,
                                        int cpu_workers) {
  const bool cuda = r.device == DeviceKind::kCuda;
  ScheduleOptions options;
  options.cpu_workers = cpu_workers;
  for (TensorClass c : kAllTensorClasses) options.placement[index_of(c)] = placement[c];
  options.weights_in_place = r.mode != Mode::kGpu && (!cuda || placement[TensorClass::kWeights] ==
                                                                   MemoryKind::kPinnedMapped);
  LAYUP_CHECK(!(cuda && options.weights_in_place &&
                placement[TensorClass::kMasterWeights] == MemoryKind::kHost),
              "--place weights=pinned makes the GPU compute with the master weights where they "
              "lie, and --place master=host puts them where the GPU cannot read; use "
              "master=pinned (the default) or leave the weights on the device");
  // Layer-major accumulation sums the micro-batches on the device: the host keeps a gradient only
  // to clip (the norm needs every block's before the first update).
  // gpu mode sums where the gradient lies already: the choice changes nothing there (a note says
  // so); one micro-batch has nothing to sum.
  const bool layer_major =
      r.mode != Mode::kGpu && r.grad_accum > 1 &&
      (r.accumulation == Accumulation::kLayerMajor ||
       (r.accumulation == Accumulation::kAuto && auto_picks_layer_major(r, cuda)));
  LAYUP_CHECK(!layer_major || !cuda || r.recompute >= 3,
              "--accumulate layer-major keeps each micro-batch's block inputs only and computes "
              "each block's forward again in its backward: it needs --recompute 3 (got ",
              r.recompute, ")");
  options.accumulation = layer_major ? Accumulation::kLayerMajor : Accumulation::kMicroBatchMajor;
  const size_t activation_bytes = cuda && r.dtype == Dtype::kBf16 ? 2 : 4;
  options.micro_batch_state_bytes =
      layer_major ? micro_batch_state_bytes(r.config, r.batch, r.seq_len, activation_bytes) : 0;
  options.hidden_state_bytes =
      layer_major ? hidden_state_bytes(r.config, r.batch, r.seq_len, activation_bytes) : 0;
  // Several ranks sum each host-updated span's gradient there, whatever the clipping.
  options.host_gradient =
      r.mode != Mode::kLayup || r.clip > 0.0f || (r.grad_accum > 1 && !layer_major) || r.ranks > 1;
  // ZeRO-1 in every mode (docs/parallel.md), except where blocks are staged through a GPU: a
  // staged update reads a whole block's state, so there every rank keeps the whole state (on the
  // CPU backend that placement is refused under ranks, below).
  options.optimizer_shards =
      cuda && r.mode == Mode::kLayup && r.optimizer_placement.blocks_staged() > 0 ? 1 : r.ranks;
  options.planned_ranks = r.ranks;
  options.optimizer_state = r.optimizer_state;
  // auto: where host and device share one memory, the spare copy would come out of what the
  // activations need.
  const int disk_blocks = r.mode == Mode::kLayup ? r.optimizer_placement.blocks_on_disk() : 0;
  LAYUP_CHECK(disk_blocks == 0 || r.layup_clip != LayupClip::kSpeculative || r.clip <= 0.0f,
              "--layup-clip speculative keeps a second copy of the optimizer state, which "
              "blocks on disk (--optimizer-placement ",
              r.optimizer_placement.name(), ") do not have; use --layup-clip deferred");
  // auto: off blocks on disk (they have no second copy), and where host and device share one
  // memory.
  const bool speculate =
      r.layup_clip == LayupClip::kSpeculative ||
      (r.layup_clip == LayupClip::kAuto && disk_blocks == 0 && !(cuda && r.attributes.integrated));
  // ZeRO-1 updates the host's blocks once the norm is known (docs/parallel.md): no speculation.
  options.speculative_clip =
      r.mode == Mode::kLayup && r.clip > 0.0f && speculate && options.optimizer_shards <= 1;
  if (r.mode == Mode::kLayup && r.layup_head == LayupHead::kDevice) {
    LAYUP_CHECK(!options.weights_in_place,
                "--layup-head device updates the head in the device's copy of the weights, and "
                "this run has none: the device computes with the master weights in place (",
                cuda ? "--place weights=pinned" : "always on the CPU backend",
                "); use --layup-head host");
  }
  // auto: where the device has memory of its own, the head's gradient is already there, and its
  // update on the host would cost a transfer each way and the CPU's time at the end of the step
  // (nothing is left to overlap it with); where host and device share one memory, the paper's
  // split keeps every update on the CPU.
  const bool head_on_the_device =
      r.mode == Mode::kLayup && !options.weights_in_place &&
      (r.layup_head == LayupHead::kDevice ||
       (r.layup_head == LayupHead::kAuto && cuda && !r.attributes.integrated));
  const int L = r.config.n_layer;
  const int device_blocks = r.optimizer_placement.blocks_on_device();
  LAYUP_CHECK(device_blocks >= 0 && device_blocks <= L, "--optimizer-placement ",
              r.optimizer_placement.name(), " asks for more blocks than the model's ", L);
  LAYUP_CHECK(r.mode == Mode::kLayup || device_blocks == 0, "--optimizer-placement ",
              r.optimizer_placement.name(), " places layup's state; ", name_of(r.mode),
              " mode keeps all of it ", r.mode == Mode::kGpu ? "on the device" : "on the host");
  LAYUP_CHECK(device_blocks == 0 || !options.weights_in_place, "--optimizer-placement ",
              r.optimizer_placement.name(),
              " updates blocks in the device's copy of the weights, and this run has none: the "
              "device computes with the master weights in place (",
              cuda ? "--place weights=pinned" : "always on the CPU backend",
              "); use --optimizer-placement host");
  LAYUP_CHECK(r.mode == Mode::kLayup || r.optimizer_placement.blocks_on_disk() == 0,
              "--optimizer-placement ", r.optimizer_placement.name(), " places layup's state; ",
              name_of(r.mode), " mode keeps all of it ",
              r.mode == Mode::kGpu ? "on the device" : "on the host");
  LAYUP_CHECK(device_blocks + disk_blocks <= L, "--optimizer-placement ",
              r.optimizer_placement.name(), " places ", device_blocks + disk_blocks,
              " blocks, and the model has ", L);
  const int staged_blocks = r.optimizer_placement.blocks_staged();
  LAYUP_CHECK(r.mode != Mode::kGpu || staged_blocks == 0, "--optimizer-placement ",
              r.optimizer_placement.name(),
              " stages blocks' state through the device; gpu mode keeps all of it on the device");
  LAYUP_CHECK(staged_blocks == 0 || disk_blocks == 0, "--optimizer-placement ",
              r.optimizer_placement.name(),
              ": blocks staged through the device and blocks on disk in one run are not "
              "supported yet; use one or the other");
  // Under ZeRO-1 of the host's state (several ranks on the CPU backend) each rank keeps a part of
  // every block's moments, and a staged update reads a whole block's.
  LAYUP_CHECK(staged_blocks == 0 || r.ranks <= 1 || cuda, "--optimizer-placement ",
              r.optimizer_placement.name(),
              " stages whole blocks' state through the device, and with ", r.ranks,
              " ranks on the CPU backend each rank keeps only its part of every block's moments "
              "(ZeRO-1); keep their state on the host (drop staged:S)");
  LAYUP_CHECK(device_blocks + disk_blocks + staged_blocks <= L, "--optimizer-placement ",
              r.optimizer_placement.name(), " places ", device_blocks + disk_blocks + staged_blocks,
              " blocks, and the model has ", L);
  LAYUP_CHECK(disk_blocks == 0 || !r.offload_dir.empty(), "--optimizer-placement ",
              r.optimizer_placement.name(),
              " keeps blocks' optimizer state on disk: give --offload-dir, a directory on a local "
              "disk with room for it");
  if (head_on_the_device || device_blocks > 0 || disk_blocks > 0 || staged_blocks > 0) {
    const ParameterLayout layout(r.config);
    options.update_sites = head_on_the_device
                               ? head_on_device(layout)
                               : std::vector<UpdateSite>(layout.spans().size(), UpdateSite::kHost);
    for (int layer = 0; layer < device_blocks; ++layer)
      options.update_sites[1 + layer] = UpdateSite::kDevice;
    // The last blocks: their updates come first in backward (without clipping), or last after
    // the norm with the most of the next forward to hide under.
    for (int layer = L - disk_blocks; layer < L; ++layer)
      options.update_sites[1 + layer] = UpdateSite::kDisk;
    // Spread over the blocks the host would update (the c-th of C staged where (c + 1) S / C
    // passes a whole number): after the norm the next forward reads them in order while the CPU
    // and the device update theirs side by side, so both deliver blocks in the forward's order.
    const int candidates = L - device_blocks - disk_blocks;
    for (int c = 0; c < candidates; ++c)
      if ((c + 1) * staged_blocks / candidates > c * staged_blocks / candidates)
        options.update_sites[1 + device_blocks + c] = UpdateSite::kStaged;
    options.offload_dir = r.offload_dir;
  }
  // A bf16 backend computes with a compute copy of its own: the host-updated spans' weights land
  // there and the device keeps no fp32 copy of them.
  options.weights_land_in_compute_copy =
      r.mode == Mode::kLayup && cuda && r.dtype == Dtype::kBf16 && !options.weights_in_place;
  const int streamed = r.streamed_blocks.blocks();
  LAYUP_CHECK(streamed == 0 || r.mode != Mode::kGpu, "--streamed-blocks ", streamed,
              ": gpu mode updates every block on the device, in place, and has no host copy of "
              "the weights to stream from; use offload or layup, or --streamed-blocks 0");
  options.streamed_blocks = r.mode == Mode::kGpu ? 0 : streamed;
  return options;
}

bool updates_head_on_device(const ScheduleOptions& options) {
  return !options.update_sites.empty() && options.update_sites.front() == UpdateSite::kDevice &&
         options.update_sites.back() == UpdateSite::kDevice;
}

std::vector<std::string> schedule_notes(const MemoryPlanRequest& r,
                                        const ScheduleOptions& options) {
  std::vector<std::string> notes;
  if (r.mode == Mode::kGpu && r.accumulation == Accumulation::kLayerMajor && r.grad_accum > 1)
    notes.push_back(
        "gpu mode sums the micro-batches where their gradients lie, on the device: "
        "--accumulate layer-major changes nothing there");
  if (r.mode == Mode::kGpu) return notes;
  const bool cuda = r.device == DeviceKind::kCuda;
  const ParameterLayout layout(r.config);
  const size_t all = layout.total_count() * sizeof(float);
  const OptimizerStateKind kind = r.optimizer_state;
  // Master weights and moments, in the run's optimizer state kind.
  const size_t state = all + optimizer_moments_bytes(kind, layout.total_count());
  const size_t head_moments = optimizer_moments_bytes(kind, layout.embeddings().count) +
                              optimizer_moments_bytes(kind, layout.final_norm().count);
  // 12 (fp32), 8 (bf16) or 6.03 (8bit): a disk record's bytes a parameter.
  char record_bytes[16];
  std::snprintf(
      record_bytes, sizeof record_bytes, "%.3g",
      4.0 + static_cast<double>(optimizer_moments_bytes(kind, 100 * kOptimizerStateBlock)) /
                (100.0 * kOptimizerStateBlock));
  const std::string memory = cuda ? "an integrated GPU" : "the CPU backend";
  const bool one_memory = !cuda || r.attributes.integrated;
  if (one_memory && !options.weights_in_place)
    notes.push_back("in one shared memory (" + memory + ") the device-side fp32 copy of " +
                    "the weights (" + format_bytes(all) +
                    ") duplicates the master weights; --place weights=pinned computes "
                    "with the master weights in place");
  if (one_memory && options.host_gradient && r.mode == Mode::kLayup)
    notes.push_back("in one shared memory (" + memory + ") the host gradient accumulator (" +
                    format_bytes(all) +
                    ") is a second whole-model gradient, kept for clipping by the global "
                    "norm and for accumulation; layup with --clip none and one "
                    "micro-batch updates each block from its slot and keeps none");
  if (r.mode == Mode::kLayup && updates_head_on_device(options))
    notes.push_back(
        "layup updates the embeddings and the final norm on the device, where their gradient "
        "is (" +
        std::string(r.layup_head == LayupHead::kAuto ? "--layup-head auto on a discrete GPU"
                                                     : "--layup-head device") +
        "): their AdamW moments take " + format_bytes(head_moments) +
        " of device memory, and the host keeps no state of them; --layup-head host updates "
        "them on the CPU with the blocks");
  int device_blocks = 0;
  for (int layer = 0; layer < r.config.n_layer && !options.update_sites.empty(); ++layer)
    device_blocks += options.update_sites[1 + layer] == UpdateSite::kDevice;
  int disk_blocks = 0, staged_blocks = 0;
  for (int layer = 0; layer < r.config.n_layer && !options.update_sites.empty(); ++layer) {
    disk_blocks += options.update_sites[1 + layer] == UpdateSite::kDisk;
    staged_blocks += options.update_sites[1 + layer] == UpdateSite::kStaged;
  }
  if (staged_blocks > 0) {
    size_t slots = 0;
    for (const PlannedAllocation& buffer : StagedTier::buffers(layout, options, DeviceKinds{}))
      slots += buffer.bytes;
    notes.push_back(
        std::to_string(staged_blocks) + " of " + std::to_string(r.config.n_layer) +
        " blocks keep their optimizer state on the host and are updated by the device's AdamW "
        "(--optimizer-placement " +
        r.optimizer_placement.name() + "), staged through " +
        std::to_string(options.staging_slots) + " slots of device memory (" + format_bytes(slots) +
        "): each step copies their gradient and state in (4 + " + record_bytes +
        " bytes a parameter) and their state back (" + record_bytes +
        "), beside the CPU's updates of the others");
  }
  if (r.mode == Mode::kLayup && device_blocks > 0)
    notes.push_back("layup keeps the optimizer state of blocks 0-" +
                    std::to_string(device_blocks - 1) + " of " + std::to_string(r.config.n_layer) +
                    " on the device and updates them there (--optimizer-placement " +
                    r.optimizer_placement.name() + "); the CPU updates the others");
  if (r.mode == Mode::kLayup && disk_blocks > 0)
    notes.push_back(
        "layup keeps the optimizer state of blocks " +
        std::to_string(r.config.n_layer - disk_blocks) + "-" +
        std::to_string(r.config.n_layer - 1) + " in a file under " + r.offload_dir +
        " (--optimizer-placement " + r.optimizer_placement.name() +
        (options.optimizer_shards > 1
             ? "; each rank a file of its own: their whole master weights and its part of their "
               "moments, ZeRO-1"
             : "") +
        "), " + std::to_string(options.disk_slots) +
        " blocks' worth of host memory stage them: each step reads and writes " + record_bytes +
        " bytes a parameter of them" +
        (options.optimizer_shards > 1 ? " (of the moments, this rank's part only)" : "") +
        ", which hides under the GPU's work only in steps long enough");
  if (options.accumulation == Accumulation::kLayerMajor && r.grad_accum > 1)
    notes.push_back(
        "micro-batches accumulate layer-major (--accumulate " + name_of(r.accumulation) +
        "): each span's forward of every micro-batch in turn (so block l's forward waits only "
        "for block l's update, and a streamed block is filled once for it; the micro-batches' "
        "residual streams take " +
        format_bytes(static_cast<size_t>(r.grad_accum) * options.hidden_state_bytes) +
        " of device memory), then each block's backward of every micro-batch in turn, summed on "
        "the device, so the host gets one gradient a block and sums only the head's "
        "micro-batches" +
        std::string(options.host_gradient
                        ? " (it keeps a whole gradient to clip by the global norm)"
                        : " (it keeps no whole-model gradient)") +
        "; the " + std::to_string(r.grad_accum) + " micro-batches' block inputs take " +
        format_bytes(static_cast<size_t>(r.grad_accum) * options.micro_batch_state_bytes) +
        " of host memory (pinned on CUDA; each crosses the link at its block's forward and "
        "again at its backward), and each block's forward runs again in backward");
  if (options.weights_land_in_compute_copy)
    notes.push_back(
        "the host-updated spans' new weights land in the backend's bf16 compute copy, cast on "
        "arrival: the device keeps no fp32 copy of them");
  const bool zero_one_host = r.mode == Mode::kLayup && options.optimizer_shards > 1;
  if (zero_one_host)
    notes.push_back("with the optimizer state split across the " +
                    std::to_string(options.optimizer_shards) +
                    " ranks (ZeRO-1) layup updates the host's blocks once the step's norm is "
                    "known, after backward, clipping or not (--layup-clip speculative runs as "
                    "deferred, with the same result)");
  else if (options.speculative_clip)
    notes.push_back(
        "clipping in layup is speculative: a second copy of the master weights and moments (" +
        format_bytes(state) +
        ") lets blocks update during backward and be redone when the step is clipped; "
        "--layup-clip deferred keeps one copy and updates the blocks after backward");
  else if (r.mode == Mode::kLayup && r.clip > 0.0f && r.layup_clip == LayupClip::kAuto &&
           disk_blocks > 0)
    notes.push_back(
        "clipping in layup is deferred (--layup-clip auto with blocks on disk, which have no "
        "second copy of their state to speculate with): the blocks are updated after backward");
  else if (r.mode == Mode::kLayup && r.clip > 0.0f && r.layup_clip == LayupClip::kAuto)
    notes.push_back(
        "clipping in layup is deferred (--layup-clip auto on an integrated GPU: a speculative "
        "second copy of the master weights and moments, " +
        format_bytes(state) +
        ", would share the one memory with everything else): the blocks are updated after "
        "backward; --layup-clip speculative overlaps them with it");
  return notes;
}

}  // namespace layup
