// The memory plan of a run, from the components' lists (memory_planner.h).
#include "engine/memory_planner.h"

#include <algorithm>
#include <optional>

#include "backend/cpu/cpu_backend_buffers.h"
#include "backend/cuda/cuda_backend_buffers.h"
#include "core/error.h"
#include "engine/backend_factory.h"
#include "engine/calibration.h"
#include "io/streamed_file_writer.h"
#include "model/parameter_layout.h"
#include "model/shape_limits.h"
#include "schedule/host_updated_model.h"
#include "schedule/schedule_plan.h"
#include "schedule/weight_ring.h"

namespace layup {

namespace {

// What the process itself holds on the host, whatever the model: its code and libraries, the
// tokenizer, the threads' stacks, the CUDA context's host side. Allowances on the generous side of
// what runs measure (bench/RESULTS.md): a CPU run's own resident set is a few tens of MiB, and a
// binary built with CUDA maps its libraries (cuBLASLt, cuDNN, NVRTC) on the CPU backend too,
// which took a small run's peak to 775 MiB against a plan of 774 with 160 MiB allowed here.
constexpr size_t kCpuRuntimeBytes = size_t{256} << 20;
constexpr size_t kCudaRuntimeBytes = size_t{2} << 30;

// The backend's and the device's buffers, as they list them.
BufferList backend_and_device_buffers(const MemoryPlanRequest& r, const Placement& placement,
                                      const ScheduleOptions& schedule) {
  if (r.device != DeviceKind::kCuda) return cpu_backend_buffers(r.config, r.batch, r.seq_len);
  const ComputeDtype dtype =
      r.dtype == Dtype::kBf16 ? ComputeDtype::kBFloat16 : ComputeDtype::kFloat32;
  BufferList list = cuda_backend_buffers(
      r.config, r.batch, r.seq_len, dtype, r.recompute,
      {placement[TensorClass::kActivations], placement[TensorClass::kScratch],
       WeightRing::compute_copies_in_ring(ParameterLayout(r.config), schedule)});
  append(list, cuda_device_buffers());
  if (r.ranks > 1) append(list, cuda_collectives_buffers());
  return list;
}

// What the process holds on the host besides the components' buffers.
BufferList process_buffers(const MemoryPlanRequest& r, const ParameterLayout& layout) {
  const size_t f = sizeof(float);
  size_t largest_tensor = 0;
  for (const TensorSpec& tensor : layout.tensors())
    largest_tensor = std::max(largest_tensor, tensor.count);
  const MemorySide host = MemorySide::kHost;
  const bool cuda = r.device == DeviceKind::kCuda;
  size_t largest_span = 0;
  for (const Span& span : layout.spans()) largest_span = std::max(largest_span, span.count);
  // fp32: the span's params, m and v. A compact kind's moments travel coded, as the run keeps
  // them (fresh zeros, Hugging Face weights, checkpoints of its kind): the params and the coded
  // span, which one rank's host, device and disk tiers take as they are; with several ranks
  // also a copy of a rank's part, coded from the part's first element.
  const OptimizerStateKind kind = r.optimizer_state;
  const size_t coded_copies = r.ranks > 1 ? 2 : 1;
  const size_t span_bytes =
      kind == OptimizerStateKind::kFp32
          ? 3 * largest_span * f
          : largest_span * f + coded_copies * optimizer_moments_padded_bytes(kind, largest_span);
  BufferList list;
  if (r.streams_checkpoints)
    list = {{host, TensorClass::kMasterWeights, MemoryKind::kHost,
             span_bytes + 2 * largest_tensor * f + 2 * kStreamedWriteBufferBytes,
             "one span's parameters and moments on their way into the schedule (fresh or resumed) "
             "or out of it (a checkpoint), and the checkpoint writer's or reader's scratch: its "
             "chunk and a matrix it transposes, a tensor each at most, and the file writer's two "
             "buffers",
             false, true}};
  else
    list = {{host, TensorClass::kMasterWeights, MemoryKind::kHost, span_bytes,
             "one span's fresh parameters and moments on their way into the schedule", false,
             true}};
  if (r.data_bytes > 0)
    list.push_back({host, TensorClass::kScratch, MemoryKind::kHost, r.data_bytes,
                    "the training and validation tokens, read into memory", false});
  list.push_back(
      {host, TensorClass::kScratch, MemoryKind::kHost, cuda ? kCudaRuntimeBytes : kCpuRuntimeBytes,
       cuda ? "the process itself: code, the CUDA runtime and cuBLASLt/cuDNN libraries, the "
              "tokenizer (an allowance)"
            : "the process itself: code, the tokenizer, the threads' stacks (an allowance)",
       false});
  return list;
}

// What the planner offers in place of its own choices when a plan is over a budget.
std::vector<PlanAlternative> alternatives(const MemoryPlanRequest& r,
                                          const ScheduleOptions& schedule) {
  std::vector<PlanAlternative> offers;
  if (schedule.speculative_clip) {
    MemoryPlanRequest deferred = r;
    deferred.layup_clip = LayupClip::kDeferred;
    offers.push_back({"--layup-clip deferred", deferred});
  }
  if (r.mode == Mode::kLayup && !r.optimizer_placement.automatic &&
      (r.optimizer_placement.device_blocks > 0 || r.optimizer_placement.disk_blocks > 0)) {
    MemoryPlanRequest automatic = r;
    automatic.optimizer_placement = {};
    offers.push_back({"--optimizer-placement auto", automatic});
  }
  if (r.mode == Mode::kLayup && updates_head_on_device(schedule)) {
    MemoryPlanRequest host_head = r;
    host_head.layup_head = LayupHead::kHost;
    offers.push_back({"--layup-head host", host_head});
  }
  return offers;
}

}  // namespace

RunMemory plan_run_memory(const MemoryPlanRequest& r, int cpu_workers) {
  validate_config(r.config);
  LAYUP_CHECK(r.device != DeviceKind::kAuto, "a memory plan needs a resolved device, cpu or cuda");
  LAYUP_CHECK(r.dtype == Dtype::kFp32 || (r.dtype == Dtype::kBf16 && r.device == DeviceKind::kCuda),
              "a memory plan needs a resolved dtype: fp32, or bf16 on cuda (got ", name_of(r.dtype),
              " on ", name_of(r.device), ")");
  LAYUP_CHECK(r.attributes.device == r.device, "the memory attributes are of ",
              name_of(r.attributes.device), ", the plan is for ", name_of(r.device));
  LAYUP_CHECK(r.batch >= 1 && r.seq_len >= 1 && r.grad_accum >= 1, "--batch, --seq-len and ",
              "--grad-accum must be at least 1 (got ", r.batch, ", ", r.seq_len, ", ", r.grad_accum,
              ")");
  LAYUP_CHECK(r.seq_len <= r.config.n_positions, "--seq-len ", r.seq_len,
              " is above the model's context of ", r.config.n_positions, " positions");
  check_shape_limits(r.config, r.batch, r.seq_len);

  RunMemory run;
  MemoryPlan& plan = run.plan;
  plan.request = r;
  plan.placement = resolve_placement(r.mode, r.attributes, r.place);
  run.schedule = choose_schedule_options(r, plan.placement, cpu_workers);
  const ParameterLayout layout(r.config);
  const bool cuda = r.device == DeviceKind::kCuda;

  run.step = compile_step_plan(r.mode, layout, run.schedule, device_kinds_of(r.device),
                               r.grad_accum, r.clip > 0.0f);
  append(plan.allocations, run.step.buffers);
  append(plan.allocations, backend_and_device_buffers(r, plan.placement, run.schedule));
  append(plan.allocations, process_buffers(r, layout));
  // Per rank: each rank's file holds its part of the moments (ZeRO-1).
  plan.disk_bytes = HostUpdatedModel::disk_bytes(layout, run.schedule);

  if (cuda) {
    if (r.dtype == Dtype::kBf16)
      plan.notes.push_back(
          "cuDNN's attention workspace is sized by cuDNN when the first step builds its graphs: "
          "measured at run time, not planned");
    plan.notes.push_back(
        "not counted: the CUDA context and the cuBLASLt/cuDNN handles' own memory "
        "(cudaMemGetInfo's reading includes them)");
  }
  for (std::string& note : schedule_notes(r, run.schedule)) plan.notes.push_back(std::move(note));
  if (cuda && plan.placement.overridden[index_of(TensorClass::kScratch)])
    plan.notes.push_back(
        "--place scratch places the backward's activation gradients; the cuBLASLt and cuDNN "
        "workspaces and the norm's partial sums stay in device memory");
  plan.notes.push_back("not counted: per-call temporaries inside the ops");
  plan.alternatives = alternatives(r, run.schedule);
  return run;
}

MemoryPlan plan_memory(const MemoryPlanRequest& request) {
  return plan_run_memory(request).plan;
}

namespace {

// Whether the plan's device side fits the device's budget and this machine's GPU.
bool device_side_fits(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  return (!budgets.device || plan.bytes(MemorySide::kDevice) <= *budgets.device_limit()) &&
         (!budgets.machine_gpu || plan.gpu_memory_bytes() <= *budgets.machine_gpu);
}

// --streamed-blocks auto against `budgets` (the placement resolved): none where the plan fits, or
// where streaming cannot run (gpu mode); else the fewest blocks that let the device's side fit,
// none where no count does (the budget check then says why). An explicit count comes back as it
// was.
MemoryPlanRequest resolve_streamed_blocks(MemoryPlanRequest request, const MemoryBudgets& budgets) {
  StreamedBlocks& streamed = request.streamed_blocks;
  if (!streamed.automatic || streamed.resolved) return request;
  streamed.resolved = true;
  streamed.count = 0;
  if (request.mode == Mode::kGpu) return request;
  const RunMemory resident = plan_run_memory(request);
  if (fits(resident.plan, budgets)) return request;
  // The blocks whose update the host runs may be streamed (WeightRing::streamed_spans).
  int host_blocks = 0;
  for (size_t index = 1; index + 1 < resident.step.spans.size(); ++index)
    host_blocks += resident.step.spans[index].site != UpdateSite::kDevice;
  const auto device_fits_streaming = [&](int count) {
    streamed.count = count;
    return device_side_fits(plan_memory(request), budgets);
  };
  // Each block streamed gives up its device weights for a share of the ring's two slots, so the
  // device's side never grows with the count: the fewest that fit, by bisection (a 96-block model
  // is planned a few times, not 96).
  if (host_blocks == 0 || !device_fits_streaming(host_blocks)) {
    streamed.count = 0;
    return request;
  }
  int fewest = host_blocks, below = 0;  // fewest fits; below does not (0: the resident plan)
  while (fewest - below > 1) {
    const int middle = below + (fewest - below) / 2;
    (device_fits_streaming(middle) ? fewest : below) = middle;
  }
  streamed.count = fewest;
  return request;
}

// Whether layup may keep blocks' state on the device: on a discrete GPU whose own memory holds the
// weights (with the weights placed in pinned memory the device computes with the master weights in
// place and has no copy to update blocks in).
bool has_device_tier(const MemoryPlanRequest& request) {
  return request.mode == Mode::kLayup && request.device == DeviceKind::kCuda &&
         !request.attributes.integrated &&
         resolve_placement(request.mode, request.attributes,
                           request.place)[TensorClass::kWeights] != MemoryKind::kPinnedMapped;
}

// --optimizer-placement auto against `budgets` (resolve_optimizer_placement), the disk only where
// `disk` allows it; an explicit placement comes back as it was.
MemoryPlanRequest resolve_blocks(MemoryPlanRequest request, const MemoryBudgets& budgets,
                                 bool disk) {
  OptimizerPlacement& placement = request.optimizer_placement;
  if (!placement.automatic || placement.resolved) return request;
  placement.resolved = true;
  placement.device_blocks = placement.disk_blocks = 0;
  if (request.mode != Mode::kLayup) return request;
  const bool device_tier = has_device_tier(request);
  const auto device_fits = [&budgets](const MemoryPlan& plan) {
    return device_side_fits(plan, budgets);
  };
  // The fastest tier first: as many blocks on the device as fit, then, if the host cannot hold
  // the rest, as few on disk as it takes (each costs its state's read and write every step).
  // An explicit --streamed-blocks N keeps N blocks' state on the host, where they stream from.
  const int host_kept = request.streamed_blocks.automatic ? 0 : request.streamed_blocks.count;
  const int movable = std::max(0, request.config.n_layer - host_kept);
  std::optional<int> device_admits;
  for (int blocks = device_tier ? movable : 0; blocks >= 0; --blocks) {
    placement.device_blocks = blocks;
    const MemoryPlan plan = plan_memory(request);
    if (fits(plan, budgets)) return request;
    if (!device_admits && device_fits(plan)) device_admits = blocks;
  }
  placement.device_blocks = device_admits.value_or(0);
  if (disk && !request.offload_dir.empty())
    for (int disk = 1; disk <= movable - placement.device_blocks; ++disk) {
      placement.disk_blocks = disk;
      if (fits(plan_memory(request), budgets)) return request;
    }
  placement.disk_blocks = 0;
  return request;
}

// Whether `request`'s plan fits `budgets`; a choice the plan refuses does not.
bool plan_fits(const MemoryPlanRequest& request, const MemoryBudgets& budgets) {
  try {
    return fits(plan_memory(request), budgets);
  } catch (const Error&) {
    return false;
  }
}

// `streamed` (placement and streaming resolved, the device's side fitting) with its host's side
// made to fit by moving the fewest host-updated blocks to disk, where `asked` lets the placement
// use the disk; none where no count fits.
std::optional<MemoryPlanRequest> with_fewest_disk_blocks(const MemoryPlanRequest& asked,
                                                         MemoryPlanRequest streamed,
                                                         const MemoryBudgets& budgets) {
  OptimizerPlacement& placement = streamed.optimizer_placement;
  if (!asked.optimizer_placement.automatic || streamed.offload_dir.empty() ||
      placement.disk_blocks > 0 || placement.blocks_staged() > 0)
    return std::nullopt;
  for (int disk = 1; disk + placement.device_blocks <= streamed.config.n_layer; ++disk) {
    placement.disk_blocks = disk;
    if (plan_fits(streamed, budgets)) return streamed;
  }
  return std::nullopt;
}

// Where no choice above fits: of the heads `asked` allows, the most blocks on the device whose plan
// fits once the fewest streamed blocks (where streaming is automatic) free the device's side. A
// block updated on the device keeps no state on the host, and streaming more blocks makes room for
// its state on the device: a run short on both sides may fit that way, where the placement chosen
// before streaming (as many blocks as fit unstreamed) does not. None where `asked`'s placement is
// explicit or no count fits.
std::optional<MemoryPlanRequest> with_more_blocks_on_device_streamed(const MemoryPlanRequest& asked,
                                                                     const MemoryBudgets& budgets) {
  if (!asked.optimizer_placement.automatic || asked.optimizer_placement.resolved ||
      !has_device_tier(asked))
    return std::nullopt;
  std::vector<LayupHead> heads = {asked.layup_head};
  if (asked.layup_head == LayupHead::kAuto) heads = {LayupHead::kDevice, LayupHead::kHost};
  const int host_kept = asked.streamed_blocks.automatic ? 0 : asked.streamed_blocks.count;
  for (int blocks = asked.config.n_layer - host_kept; blocks >= 1; --blocks)
    for (const LayupHead head : heads) {
      MemoryPlanRequest tried = asked;
      tried.layup_head = head;
      tried.optimizer_placement.resolved = true;
      tried.optimizer_placement.device_blocks = blocks;
      tried.optimizer_placement.disk_blocks = 0;
      try {
        tried = resolve_streamed_blocks(tried, budgets);
      } catch (const Error&) {
        continue;
      }
      if (plan_fits(tried, budgets)) return tried;
    }
  return std::nullopt;
}

// --optimizer-placement and --layup-head auto (resolve_optimizer_placement).
MemoryPlanRequest resolve_placement_and_head(MemoryPlanRequest request,
                                             const MemoryBudgets& budgets) {
  // --layup-head auto puts the head on a discrete GPU; where no plan with it there fits and one
  // with it on the host does, it goes to the host, before any block goes to disk (the head's
  // update on the CPU costs less than a block's state read and written every step).
  const bool head_may_move = request.mode == Mode::kLayup &&
                             request.layup_head == LayupHead::kAuto &&
                             updates_head_on_device(plan_run_memory(request).schedule);
  if (!head_may_move) return resolve_blocks(request, budgets, /*disk=*/true);
  MemoryPlanRequest host_head = request;
  host_head.layup_head = LayupHead::kHost;
  for (const bool disk : {false, true})
    for (const MemoryPlanRequest* tried : {&request, &host_head}) {
      MemoryPlanRequest resolved = resolve_blocks(*tried, budgets, disk);
      if (fits(plan_memory(resolved), budgets)) return resolved;
    }
  return resolve_blocks(request, budgets, /*disk=*/true);  // nothing fits: the check says why
}

// --optimizer-placement, --layup-head and --streamed-blocks auto without staged blocks.
MemoryPlanRequest resolve_tiers(MemoryPlanRequest request, const MemoryBudgets& budgets) {
  MemoryPlanRequest resolved =
      resolve_streamed_blocks(resolve_placement_and_head(request, budgets), budgets);
  // The head's and the blocks' placement are chosen before streaming, which they do not see:
  // where nothing fits, the head on the host (its moments off the device) may leave room enough
  // for the fewest streamed blocks. So auto refuses no run that explicit choices fit.
  if (fits(plan_memory(resolved), budgets)) return resolved;
  std::vector<MemoryPlanRequest> streamed = {resolved};
  if (request.mode == Mode::kLayup && request.layup_head == LayupHead::kAuto &&
      request.streamed_blocks.automatic && !request.streamed_blocks.resolved) {
    MemoryPlanRequest host_head = request;
    host_head.layup_head = LayupHead::kHost;
    streamed.push_back(
        resolve_streamed_blocks(resolve_placement_and_head(host_head, budgets), budgets));
    if (fits(plan_memory(streamed.back()), budgets)) return streamed.back();
  }
  // The blocks' placement put none on disk where the device side did not fit before streaming:
  // with the streamed count that fits the device, as few blocks on disk as the host needs (a
  // streamed block on disk streams from a host copy of its weights alone), whether the head's
  // placement was the planner's or the user's.
  for (const MemoryPlanRequest& tried : streamed)
    if (std::optional<MemoryPlanRequest> on_disk = with_fewest_disk_blocks(request, tried, budgets))
      return *on_disk;
  if (std::optional<MemoryPlanRequest> more = with_more_blocks_on_device_streamed(request, budgets))
    return *more;
  return resolved;
}

// The predicted step of `request`'s plan at `rates` where the plan fits `budgets` (one plan for
// both); none where it does not, where the plan cannot be made (a choice it refuses) or the rates
// cannot predict it.
std::optional<double> fitting_step_s(const MemoryPlanRequest& request, const MemoryBudgets& budgets,
                                     const MachineRates& rates) {
  try {
    const RunMemory run = plan_run_memory(request);
    if (!fits(run.plan, budgets)) return std::nullopt;
    const StepTimeRequest step = step_time_request(request, run.step);
    if (!missing_rates(step, rates).empty()) return std::nullopt;
    return predict_step_time(step, rates).step_s;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// With a calibration, --layup-head and --streamed-blocks auto by time: of the plans that fit, the
// one predicted fastest at `rates`, against `resolved` (the fewest streamed blocks that fit, the
// head on the device where it fits): the head on the device or the host, the blocks placed as
// `resolved` places them or (an automatic placement) all on the host, and any streamed count up
// to every host block. Streaming more blocks frees device memory the head's state can use, and
// with a layer-major forward each streamed block crosses the link about twice a step, under the
// GPU's work; the first choice stays unless another beats it by 1%. Only layup on a discrete GPU,
// one rank, streaming automatic.
MemoryPlanRequest resolve_tiers_by_time(MemoryPlanRequest resolved, const MemoryPlanRequest& asked,
                                        const MemoryBudgets& budgets, const MachineRates* rates) {
  const bool may_choose = rates != nullptr && asked.mode == Mode::kLayup &&
                          asked.device == DeviceKind::kCuda && !asked.attributes.integrated &&
                          asked.ranks <= 1 && asked.streamed_blocks.automatic &&
                          !asked.streamed_blocks.resolved;
  if (!may_choose) return resolved;
  const std::optional<double> first = fitting_step_s(resolved, budgets, *rates);
  if (!first) return resolved;
  std::vector<LayupHead> heads = {resolved.layup_head};
  if (asked.layup_head == LayupHead::kAuto) heads = {LayupHead::kDevice, LayupHead::kHost};
  std::vector<OptimizerPlacement> placements = {resolved.optimizer_placement};
  if (asked.optimizer_placement.automatic && resolved.optimizer_placement.blocks_on_device() > 0) {
    OptimizerPlacement host = resolved.optimizer_placement;
    host.device_blocks = 0;
    placements.push_back(host);
  }
  MemoryPlanRequest best = resolved;
  double best_s = *first * 0.99;
  for (const LayupHead head : heads)
    for (const OptimizerPlacement& placement : placements)
      // From every block down: of counts predicted alike, the most streamed leaves the device
      // the most room.
      for (int count = resolved.config.n_layer; count >= 0; --count) {
        MemoryPlanRequest tried = resolved;
        tried.layup_head = head;
        tried.optimizer_placement = placement;
        tried.streamed_blocks = {true, count, true};
        const std::optional<double> step_s = fitting_step_s(tried, budgets, *rates);
        if (!step_s || *step_s >= best_s) continue;
        best = tried;
        best_s = *step_s;
      }
  return best;
}

// Whether `request`'s plan streams a staged block (the block's state and both its fills cross the
// link up each step).
bool streams_a_staged_block(const MemoryPlanRequest& request) {
  const StepPlan step = plan_run_memory(request).step;
  return std::any_of(step.spans.begin(), step.spans.end(), [](const SpanPlan& span) {
    return span.site == UpdateSite::kStaged && span.streamed;
  });
}

// --optimizer-placement auto's staged blocks (resolve_optimizer_placement): `resolved` (its other
// choices made from `asked`) with the number of blocks staged through the device whose plan fits
// and is predicted fastest at `rates`, each count's streamed blocks resolved again (the slots take
// device memory); none where no count beats staging none by 1%. Only offload and layup on a
// discrete GPU with a host-updated block, one rank and no block on disk, and an automatic
// placement; never a staged block that is streamed (an explicit staged:S may be): the one such
// run measured (Llama 3 8B at 24 GB, an H100, 13 staged of 28 streamed) took 1.42x its predicted
// step, where plans without staging measured 1.0-1.14x (docs/time_model.md).
MemoryPlanRequest resolve_staged_blocks(MemoryPlanRequest resolved, const MemoryPlanRequest& asked,
                                        const MemoryBudgets& budgets, const MachineRates* rates) {
  const OptimizerPlacement& placement = resolved.optimizer_placement;
  const bool may_stage = rates != nullptr && asked.optimizer_placement.automatic &&
                         !asked.optimizer_placement.resolved &&
                         (resolved.mode == Mode::kLayup || resolved.mode == Mode::kOffload) &&
                         resolved.device == DeviceKind::kCuda && !resolved.attributes.integrated &&
                         resolved.ranks <= 1 && placement.blocks_on_disk() == 0;
  if (!may_stage) return resolved;
  const int candidates = resolved.config.n_layer - placement.blocks_on_device();
  const std::optional<double> none = fitting_step_s(resolved, budgets, *rates);
  if (candidates <= 0 || !none) return resolved;
  MemoryPlanRequest best = resolved;
  double best_s = *none * 0.99;
  for (int staged = 1; staged <= candidates; ++staged) {
    MemoryPlanRequest tried = resolved;
    tried.optimizer_placement.automatic = true;
    tried.optimizer_placement.resolved = true;
    tried.optimizer_placement.staged_blocks = staged;
    if (asked.streamed_blocks.automatic) {
      tried.streamed_blocks = asked.streamed_blocks;
      tried.streamed_blocks.resolved = false;
      try {
        tried = resolve_streamed_blocks(tried, budgets);
      } catch (const Error&) {
        continue;
      }
    }
    const std::optional<double> step_s = fitting_step_s(tried, budgets, *rates);
    if (!step_s || *step_s >= best_s || streams_a_staged_block(tried)) continue;
    best = tried;
    best_s = *step_s;
  }
  return best;
}

}  // namespace

MemoryPlanRequest resolve_optimizer_placement(MemoryPlanRequest request,
                                              const MemoryBudgets& budgets,
                                              const MachineRates* rates) {
  return resolve_staged_blocks(
      resolve_tiers_by_time(resolve_tiers(request, budgets), request, budgets, rates), request,
      budgets, rates);
}

void check_run_budget(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  check_budget(plan, budgets, [&budgets](const MemoryPlanRequest& request) {
    return plan_memory(resolve_optimizer_placement(request, budgets));
  });
}

void check_run_shape(const MemoryPlanRequest& request, const MemoryBudgets& budgets) {
  const std::optional<ShapeLimitBreach> breach =
      shape_limit_breach(request.config, request.batch, request.seq_len);
  if (!breach) return;
  if (breach->flag != "--batch") fail(breach->message());
  // The batch alone is past a limit, so the batches below it can be planned: say which of them
  // the memory holds too, as the budget check would have.
  MemoryPlanRequest below = request;
  below.batch = static_cast<int>(breach->largest) + 1;
  const int fitting = largest_fitting_batch(below, budgets, [&budgets](const MemoryPlanRequest& r) {
    return plan_memory(resolve_optimizer_placement(r, budgets));
  });
  if (fitting == breach->largest) fail(breach->message());
  ShapeLimitBreach within_memory = *breach;
  within_memory.largest = fitting;
  if (fitting > 0) fail(within_memory.message(), ", the largest that the memory limits hold");
  fail(breach->message(), "; but not even --batch 1 fits the memory limits at --seq-len ",
       request.seq_len, ": choose a smaller model or a shorter --seq-len");
}

}  // namespace layup
