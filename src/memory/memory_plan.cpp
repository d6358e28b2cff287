// The memory plan: placement, the bytes of every buffer a run allocates, budgets and reports.
// See memory_plan.h; the buffers listed here are those of schedule/*.cpp and of the backends
// (memory/backend_memory.h), and must change with them (memory_plan_test.cpp compares the plan
// with what the accountant measures).
#include "memory/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>

#include "core/error.h"
#include "memory/backend_memory.h"
#include "model/parameter_layout.h"
#include "optim/grad_norm.h"
#include "optim/host_adamw.h"

namespace layup {

namespace {

// What the process itself holds on the host, whatever the model: its code and libraries, the
// tokenizer, the threads' stacks. Allowances on the generous side of what was measured: a tiny
// CPU run peaks at ~30 MiB resident; small CUDA runs on the H200 peaked 1.6 GiB under plans that
// hold this allowance (bench/runs/2026-12-01e-h200-host-and-gpu-limits.md).
constexpr size_t kCpuRuntimeBytes = size_t{160} << 20;
constexpr size_t kCudaRuntimeBytes = size_t{2} << 30;

std::string side_word(MemorySide side) {
  return side == MemorySide::kDevice ? "device" : "host";
}

// Why `kind` cannot hold the primary tensors of `tensor_class` in `mode` on this device; empty
// when it can.
std::string why_not(Mode mode, const DeviceMemoryAttributes& attributes, TensorClass tensor_class,
                    MemoryKind kind) {
  const std::string label = tensor_class_label(tensor_class);
  if (attributes.device == DeviceKind::kCpu) {
    if (kind == MemoryKind::kHost) return "";
    return "the CPU backend has only host memory; device, pinned, managed and pageable memory "
           "need --device cuda";
  }
  const bool gpu_uses_it = primary_side(mode, tensor_class) == MemorySide::kDevice;
  switch (kind) {
    case MemoryKind::kDevice:
      if (gpu_uses_it) return "";
      return "in " + name_of(mode) + " mode AdamW runs on the CPU, which reads and writes the " +
             label + " and cannot touch device memory; use host or pinned";
    case MemoryKind::kPinnedMapped:
      if (attributes.can_map_host_memory) return "";
      return "this GPU cannot map host memory (cudaDevAttrCanMapHostMemory = 0)";
    case MemoryKind::kManaged:
      if (!attributes.managed_memory)
        return "this GPU has no managed memory (cudaDevAttrManagedMemory = 0)";
      if (!attributes.concurrent_managed_access)
        return "this GPU reports concurrent managed access = 0 (as a Jetson Orin does): the CPU "
               "must not touch managed memory while any kernel runs, and the CPU's work overlaps "
               "the GPU's; use device or pinned";
      return "";
    case MemoryKind::kPageable:
      if (attributes.pageable_memory_access) return "";
      return "this GPU cannot access pageable host memory (cudaDevAttrPageableMemoryAccess = 0; "
             "Grace Hopper can, a discrete GPU over PCIe cannot); use pinned";
    case MemoryKind::kHost:
      if (!gpu_uses_it) return "";
      return "the GPU computes on the " + label + " in " + name_of(mode) +
             " mode, and plain host memory is the CPU's alone; use device or pinned" +
             (attributes.pageable_memory_access ? " or pageable" : "");
  }
  return "unknown memory kind";
}

// 1 - a / b as a fraction, 0 when b is 0.
double saved_fraction(size_t a, size_t b) {
  return b == 0 ? 0.0 : 1.0 - static_cast<double>(a) / static_cast<double>(b);
}

std::string describe_run(const MemoryPlanRequest& r) {
  return r.model_name + " in " + name_of(r.mode) + " mode at B=" + std::to_string(r.batch) +
         ", T=" + std::to_string(r.seq_len) +
         (r.grad_accum > 1 ? " x" + std::to_string(r.grad_accum) + " accumulation" : "") + " (" +
         name_of(r.dtype) + " on " + name_of(r.device) + ")";
}

// The smallest change that fits, in `mode`: the mode as it is, a smaller batch, or batch 1 with
// a shorter sequence. Empty when nothing fits. Sets *bytes to that plan's `need`.
std::string fitting_change(const MemoryPlanRequest& base, Mode mode, const MemoryBudgets& budgets,
                           const std::function<size_t(const MemoryPlan&)>& need, size_t* bytes) {
  MemoryPlanRequest request = base;
  request.mode = mode;
  // Placement does not change how many bytes a plan needs, and a --place valid in one mode may not
  // be in another (the master weights change sides).
  request.place.clear();
  auto try_plan = [&](int batch, int seq_len) {
    request.batch = batch;
    request.seq_len = seq_len;
    const MemoryPlan plan = plan_memory(request);
    *bytes = need(plan);
    return fits(plan, budgets);
  };
  const std::string mode_flag = mode == base.mode ? "" : "--mode " + name_of(mode);
  auto with_mode = [&](const std::string& rest) {
    return mode_flag.empty() ? rest : rest.empty() ? mode_flag : mode_flag + " " + rest;
  };
  if (mode != base.mode && try_plan(base.batch, base.seq_len)) return with_mode("");
  for (int batch = base.batch - 1; batch >= 1; --batch)
    if (try_plan(batch, base.seq_len)) return with_mode("--batch " + std::to_string(batch));
  // Memory grows with T: the longest sequence that fits at batch 1, by bisection.
  int lo = 0, hi = base.seq_len;  // fits(lo) or lo == 0; !fits(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (try_plan(1, mid) ? lo : hi) = mid;
  }
  if (lo == 0) return "";
  try_plan(1, lo);
  return with_mode("--batch 1 --seq-len " + std::to_string(lo));
}

std::string budget_line(const char* flag, size_t budget, size_t need) {
  std::string line =
      std::string(flag) + " " + format_bytes(budget) + ": needs " + format_bytes(need);
  line += need <= budget ? ", fits (" + format_bytes(budget - need) + " to spare)"
                         : ", OVER by " + format_bytes(need - budget);
  return line;
}

}  // namespace

std::string Placement::describe() const {
  std::string text;
  for (TensorClass c : kAllTensorClasses) {
    if (!text.empty()) text += ", ";
    text += std::string(tensor_class_name(c)) + "=" + memory_kind_name(kinds[index_of(c)]);
    if (overridden[index_of(c)]) text += " (--place)";
  }
  return text;
}

MemorySide primary_side(Mode mode, TensorClass tensor_class) {
  if (mode == Mode::kGpu) return MemorySide::kDevice;
  return tensor_class == TensorClass::kMasterWeights ||
                 tensor_class == TensorClass::kOptimizerMoments
             ? MemorySide::kHost
             : MemorySide::kDevice;
}

Placement default_placement(Mode mode, const DeviceMemoryAttributes& attributes) {
  Placement placement;
  for (TensorClass c : kAllTensorClasses) {
    const bool cuda = attributes.device == DeviceKind::kCuda;
    const bool on_device = cuda && primary_side(mode, c) == MemorySide::kDevice;
    // Host-side master weights are copied to the device after every update: pinned on CUDA.
    const bool pinned = cuda && !on_device && c == TensorClass::kMasterWeights;
    placement.kinds[index_of(c)] =
        on_device ? MemoryKind::kDevice : (pinned ? MemoryKind::kPinnedMapped : MemoryKind::kHost);
  }
  return placement;
}

Placement resolve_placement(Mode mode, const DeviceMemoryAttributes& attributes,
                            const std::vector<std::string>& place_flags) {
  Placement placement = default_placement(mode, attributes);
  for (const std::string& flag : place_flags) {
    const size_t equals = flag.find('=');
    LAYUP_CHECK(equals != std::string::npos && equals > 0 && equals + 1 < flag.size(),
                "--place takes CLASS=KIND, e.g. --place grads=pinned (got '", flag, "')");
    TensorClass tensor_class;
    MemoryKind kind;
    try {
      tensor_class = parse_tensor_class(flag.substr(0, equals));
      kind = parse_memory_kind(flag.substr(equals + 1));
    } catch (const Error& error) {
      fail("--place ", flag, ": ", error.what());
    }
    const std::string why = why_not(mode, attributes, tensor_class, kind);
    LAYUP_CHECK(why.empty(), "--place ", flag, " is refused on ", name_of(attributes.device),
                attributes.device == DeviceKind::kCuda ? " (" + attributes.name + ")" : "", ": ",
                why);
    placement.kinds[index_of(tensor_class)] = kind;
    placement.overridden[index_of(tensor_class)] = true;
  }
  return placement;
}

size_t MemoryPlan::bytes(MemorySide side) const {
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (a.side == side) sum += a.bytes;
  return sum;
}

size_t MemoryPlan::bytes(MemorySide side, TensorClass tensor_class) const {
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (a.side == side && a.tensor_class == tensor_class && !a.transient) sum += a.bytes;
  return sum;
}

size_t MemoryPlan::bytes(TensorClass tensor_class) const {
  return bytes(MemorySide::kDevice, tensor_class) + bytes(MemorySide::kHost, tensor_class);
}

size_t MemoryPlan::accounted_bytes(MemorySide side, TensorClass tensor_class,
                                   MemoryKind kind) const {
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (a.accounted && a.side == side && a.tensor_class == tensor_class && a.kind == kind)
      sum += a.bytes;
  return sum;
}

size_t MemoryPlan::total_bytes() const {
  return bytes(MemorySide::kDevice) + bytes(MemorySide::kHost);
}

size_t MemoryPlan::transient_bytes() const {
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (a.transient) sum += a.bytes;
  return sum;
}

size_t MemoryPlan::gpu_memory_bytes() const {
  if (request.device == DeviceKind::kCpu || request.attributes.integrated) return 0;
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (a.kind == MemoryKind::kDevice || a.kind == MemoryKind::kManaged) sum += a.bytes;
  return sum;
}

size_t MemoryPlan::host_memory_bytes() const {
  // Device memory is the host's DRAM on the CPU backend and on an integrated GPU; managed memory
  // on a discrete GPU lives in the GPU's memory while kernels use it.
  const bool one_memory = request.device == DeviceKind::kCpu || request.attributes.integrated;
  size_t sum = 0;
  for (const PlannedAllocation& a : allocations)
    if (one_memory || a.kind == MemoryKind::kHost || a.kind == MemoryKind::kPinnedMapped ||
        a.kind == MemoryKind::kPageable)
      sum += a.bytes;
  return sum;
}

MemoryPlan plan_memory(const MemoryPlanRequest& r) {
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

  MemoryPlan plan;
  plan.request = r;
  plan.placement = resolve_placement(r.mode, r.attributes, r.place);
  const ParameterLayout layout(r.config);
  const size_t f = sizeof(float);
  const size_t all = layout.total_count() * f;
  const size_t block = layout.block().count * f;
  const size_t embeddings = layout.embeddings().count * f;
  const size_t final_norm = layout.final_norm().count * f;
  const bool cuda = r.device == DeviceKind::kCuda;
  // What the code allocates today: Device memory (cudaMalloc, or host memory on the CPU backend)
  // on the device side; on the host side, what the device copies to and from in the device's host
  // memory (Device::allocate_host: pinned on CUDA) and the rest in plain host memory.
  const MemoryKind device_memory = cuda ? MemoryKind::kDevice : MemoryKind::kHost;
  const MemoryKind copied_host_memory = cuda ? MemoryKind::kPinnedMapped : MemoryKind::kHost;

  auto add_kind = [&](MemorySide side, TensorClass c, MemoryKind kind, size_t bytes,
                      std::string what, bool accounted) {
    // The placement governs a class's primary tensors, and they are allocated where it says
    // (the schedules' through ScheduleOptions::placement, the CUDA backend's activations and
    // scratch through CudaArenaKinds); a schedule's extra host copies of a device-side class
    // (accumulator, staging) keep their kind, and so do the buffers pushed below with a fixed
    // kind (the bf16 compute copy, the libraries' workspaces).
    if (primary_side(r.mode, c) == side) kind = plan.placement[c];
    plan.allocations.push_back({side, c, kind, bytes, std::move(what), accounted});
  };
  auto add = [&](MemorySide side, TensorClass c, size_t bytes, std::string what, bool accounted) {
    add_kind(side, c, side == MemorySide::kDevice ? device_memory : MemoryKind::kHost, bytes,
             std::move(what), accounted);
  };
  const MemorySide dev = MemorySide::kDevice, host = MemorySide::kHost;

  plan.weights_in_place = r.mode != Mode::kGpu && (!cuda || plan.placement[TensorClass::kWeights] ==
                                                                MemoryKind::kPinnedMapped);
  LAYUP_CHECK(!(cuda && plan.weights_in_place &&
                plan.placement[TensorClass::kMasterWeights] == MemoryKind::kHost),
              "--place weights=pinned makes the GPU compute with the master weights where they "
              "lie, and --place master=host puts them where the GPU cannot read; use "
              "master=pinned (the default) or leave the weights on the device");
  plan.host_gradient = r.mode != Mode::kLayup || r.clip > 0.0f || r.grad_accum > 1;
  // auto: where host and device share one memory, the spare copy would come out of what the
  // activations need.
  const bool speculate = r.layup_clip == LayupClip::kSpeculative ||
                         (r.layup_clip == LayupClip::kAuto && !(cuda && r.attributes.integrated));
  plan.speculative_clip = r.mode == Mode::kLayup && r.clip > 0.0f && speculate;
  if (r.mode == Mode::kLayup && r.layup_head == LayupHead::kDevice) {
    LAYUP_CHECK(!plan.weights_in_place,
                "--layup-head device updates the head in the device's copy of the weights, and "
                "this run has none: the device computes with the master weights in place (",
                cuda ? "--place weights=pinned" : "always on the CPU backend",
                "); use --layup-head host");
  }
  // auto: where the device has memory of its own, the head's gradient is already there, and its
  // update on the host would cost a transfer each way and the CPU's time at the end of the step
  // (nothing is left to overlap it with); where host and device share one memory, the paper's
  // split keeps every update on the CPU.
  plan.head_on_device = r.mode == Mode::kLayup && !plan.weights_in_place &&
                        (r.layup_head == LayupHead::kDevice ||
                         (r.layup_head == LayupHead::kAuto && cuda && !r.attributes.integrated));

  // The schedule's buffers (schedule/*.cpp).
  if (r.mode == Mode::kGpu) {
    add(dev, TensorClass::kMasterWeights, all, "fp32 weights: read by forward, updated by AdamW",
        true);
    add(dev, TensorClass::kWeightGrads, all, "whole-model gradient", true);
    if (r.grad_accum > 1)
      add(dev, TensorClass::kWeightGrads, all,
          "whole-model sum over micro-batches (allocated at the first step)", true);
    add(dev, TensorClass::kOptimizerMoments, 2 * all, "AdamW m and v", true);
    add_kind(host, TensorClass::kScratch, copied_host_memory,
             layout.spans().size() * sizeof(double),
             "per-span gradient sums of squares the device writes", true);
  } else {
    if (!plan.weights_in_place)
      add(dev, TensorClass::kWeights, all, "fp32 copy of the weights the device computes with",
          true);
    if (r.mode == Mode::kOffload) {
      add(dev, TensorClass::kWeightGrads, all, "whole-model gradient of one micro-batch", true);
    } else {
      add(dev, TensorClass::kWeightGrads, 2 * block, "two block gradient slots (double buffer)",
          true);
      add(dev, TensorClass::kWeightGrads, embeddings,
          "embeddings' gradient (complete only at the end of backward)", true);
      add(dev, TensorClass::kWeightGrads, final_norm, "final norm's gradient", true);
      if (plan.head_on_device) {
        add(dev, TensorClass::kOptimizerMoments, 2 * (embeddings + final_norm),
            "AdamW m and v of the embeddings and the final norm (updated on the device)", true);
        if (r.grad_accum > 1)
          add(dev, TensorClass::kWeightGrads, embeddings + final_norm,
              "the head's gradient summed over micro-batches (allocated at the first step)", true);
      }
    }
    // HostOptimizerSchedule: what the device copies to and from comes from allocate_host.
    add_kind(host, TensorClass::kMasterWeights, copied_host_memory, all,
             plan.weights_in_place ? "fp32 master weights (the device computes with them in place)"
                                   : "fp32 master weights",
             true);
    if (plan.host_gradient) {
      add_kind(host, TensorClass::kWeightGrads, copied_host_memory, all,
               "fp32 gradient accumulated over micro-batches", true);
      // Later micro-batches' gradients land in a staging buffer of kStagingChunks (64)
      // sum-of-squares chunks, or the largest span where that is shorter.
      size_t largest_span = 0;
      for (const Span& span : layout.spans()) largest_span = std::max(largest_span, span.count);
      add_kind(host, TensorClass::kWeightGrads, copied_host_memory,
               std::min(largest_span, 64 * kSumOfSquaresChunk) * f,
               "staging of later micro-batches' gradients", true);
    } else if (cuda && plan.placement[TensorClass::kWeightGrads] == MemoryKind::kDevice) {
      // Where the host cannot read the gradients' memory, each slot's gradient lands in a buffer
      // of its own, and the head's in one more (the CPU backend, and gradients placed in pinned
      // or managed memory, are read in place).
      add_kind(host, TensorClass::kWeightGrads, copied_host_memory,
               2 * block + (plan.head_on_device ? 0 : embeddings + final_norm),
               plan.head_on_device ? "landing buffers of the two gradient slots"
                                   : "landing buffers of the two gradient slots and of the head's "
                                     "gradients",
               true);
    }
    add(host, TensorClass::kOptimizerMoments, 2 * all, "AdamW m and v", true);
    add_kind(host, TensorClass::kScratch, copied_host_memory,
             layout.spans().size() * sizeof(double),
             "per-span gradient sums of squares the device writes", true);
    if (plan.speculative_clip) {
      add_kind(host, TensorClass::kMasterWeights, copied_host_memory, all,
               "spare fp32 master weights (speculative clipping writes the new state here)", true);
      add(host, TensorClass::kOptimizerMoments, 2 * all,
          "spare AdamW m and v (speculative clipping)", true);
    }
  }

  // The backend's buffers (memory/backend_memory.h).
  if (cuda) {
    const bool bf16 = r.dtype == Dtype::kBf16;
    const BackendBytes arena = cuda_arena_bytes(r.config, r.batch, r.seq_len, bf16, r.recompute);
    if (bf16)  // derived from the fp32 weights wherever those are placed, so always on the device
      plan.allocations.push_back({dev, TensorClass::kWeights, MemoryKind::kDevice, arena.weights,
                                  "bf16 compute copy of the weights (the backend's weights region)",
                                  true});
    add(dev, TensorClass::kActivations, arena.activations,
        "activations saved for the backward, token ids, logits (the backend's activations)", true);
    add(dev, TensorClass::kScratch, arena.scratch,
        "activation gradients and the ops' scratch (the backend's scratch)", true);
    // The libraries' and the device's own workspaces stay in device memory whatever --place
    // scratch says (it places the backward's activation gradients above).
    plan.allocations.push_back({dev, TensorClass::kScratch, MemoryKind::kDevice,
                                kCublasLtWorkspaceBytes, "cuBLASLt workspace", true});
    plan.allocations.push_back({dev, TensorClass::kScratch, MemoryKind::kDevice,
                                kCudaDeviceScratchBytes, "gradient-norm partial sums", true});
    plan.allocations.push_back({host, TensorClass::kScratch, MemoryKind::kPinnedMapped,
                                cuda_pinned_staging_bytes(r.batch, r.seq_len),
                                "pinned staging of token ids, targets and losses", true});
    if (bf16)
      plan.notes.push_back(
          "cuDNN's attention workspace is sized by cuDNN when the first step builds its graphs: "
          "measured at run time, not planned");
    plan.notes.push_back(
        "not counted: the CUDA context and the cuBLASLt/cuDNN handles' own memory "
        "(cudaMemGetInfo's reading includes them)");
  } else {
    const BackendBytes cpu = cpu_backend_memory(r.config, r.batch, r.seq_len);
    add(dev, TensorClass::kActivations, cpu.activations,
        "the CPU backend's activations for the backward (per block, with the B x heads x T x T "
        "attention probabilities), token ids, logits",
        false);
    add(dev, TensorClass::kScratch, cpu.scratch,
        "the CPU backend's activation gradients and a chunk of the logits' gradient", false);
    plan.notes.push_back(
        "the CPU backend's activation vectors are planned, not measured (it does not record "
        "them in the accountant yet)");
  }
  if (r.mode != Mode::kGpu) {
    const std::string memory = cuda ? "an integrated GPU" : "the CPU backend";
    if ((!cuda || r.attributes.integrated) && !plan.weights_in_place)
      plan.notes.push_back("in one shared memory (" + memory + ") the device-side fp32 copy of " +
                           "the weights (" + format_bytes(all) +
                           ") duplicates the master weights; --place weights=pinned computes "
                           "with the master weights in place");
    if ((!cuda || r.attributes.integrated) && plan.host_gradient && r.mode == Mode::kLayup)
      plan.notes.push_back("in one shared memory (" + memory + ") the host gradient accumulator (" +
                           format_bytes(all) +
                           ") is a second whole-model gradient, kept for clipping by the global "
                           "norm and for accumulation; layup with --clip none and one "
                           "micro-batch updates each block from its slot and keeps none");
    if (plan.head_on_device)
      plan.notes.push_back(
          "layup updates the embeddings and the final norm on the device, where their gradient "
          "is (" +
          std::string(r.layup_head == LayupHead::kAuto ? "--layup-head auto on a discrete GPU"
                                                       : "--layup-head device") +
          "): their AdamW moments take " + format_bytes(2 * (embeddings + final_norm)) +
          " of device memory, and their spans of the host's master weights and moments go "
          "unused; --layup-head host updates them on the CPU with the blocks");
    if (plan.speculative_clip)
      plan.notes.push_back(
          "clipping in layup is speculative: a second copy of the master weights and moments (" +
          format_bytes(3 * all) +
          ") lets blocks update during backward and be redone when the step is clipped; "
          "--layup-clip deferred keeps one copy and updates the blocks after backward");
    else if (r.mode == Mode::kLayup && r.clip > 0.0f && r.layup_clip == LayupClip::kAuto)
      plan.notes.push_back(
          "clipping in layup is deferred (--layup-clip auto on an integrated GPU: a speculative "
          "second copy of the master weights and moments, " +
          format_bytes(3 * all) +
          ", would share the one memory with everything else): the blocks are updated after "
          "backward; --layup-clip speculative overlaps them with it");
  }
  if (cuda && plan.placement.overridden[index_of(TensorClass::kScratch)])
    plan.notes.push_back(
        "--place scratch places the backward's activation gradients; the cuBLASLt and cuDNN "
        "workspaces and the norm's partial sums stay in device memory");
  // What the process holds on the host besides the schedule's and the backend's buffers.
  size_t largest_tensor = 0;
  for (const TensorSpec& tensor : layout.tensors())
    largest_tensor = std::max(largest_tensor, tensor.count);
  plan.allocations.push_back(
      {host, TensorClass::kMasterWeights, MemoryKind::kHost, all + largest_tensor * f,
       "parameters in layout order on their way into the schedule (initialised or loaded) or out "
       "of it (a checkpoint), and one tensor of the checkpoint writer's or reader's scratch",
       false, true});
  plan.allocations.push_back({host, TensorClass::kOptimizerMoments, MemoryKind::kHost, 2 * all,
                              "AdamW m and v on their way into or out of the schedule (the "
                              "start, a checkpoint)",
                              false, true});
  if (r.data_bytes > 0)
    plan.allocations.push_back({host, TensorClass::kScratch, MemoryKind::kHost, r.data_bytes,
                                "the training and validation tokens, read into memory", false});
  plan.allocations.push_back(
      {host, TensorClass::kScratch, MemoryKind::kHost, cuda ? kCudaRuntimeBytes : kCpuRuntimeBytes,
       cuda ? "the process itself: code, the CUDA runtime and cuBLASLt/cuDNN libraries, the "
              "tokenizer (an allowance)"
            : "the process itself: code, the tokenizer, the threads' stacks (an allowance)",
       false});
  plan.notes.push_back("not counted: per-call temporaries inside the ops");
  return plan;
}

std::string MemoryBudgets::describe() const {
  std::string text;
  auto add = [&](const char* flag, const std::optional<size_t>& value) {
    if (!value) return;
    if (!text.empty()) text += ", ";
    text += std::string(flag) + " " + format_bytes(*value);
  };
  add("--memory-budget", total);
  add("--device-budget", device);
  add("--host-budget", host);
  return text.empty() ? "none" : text;
}

size_t parse_memory_size(const std::string& text, const std::string& flag) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double number = std::strtod(begin, &end);
  std::string unit(end);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  double scale = 0.0;
  if (unit.empty() || unit == "B") scale = 1.0;
  const char* prefixes = "KMGT";
  for (int i = 0; i < 4; ++i) {
    const std::string p(1, prefixes[i]);
    if (unit == p || unit == p + "IB") scale = std::pow(1024.0, i + 1);
    if (unit == p + "B") scale = std::pow(1000.0, i + 1);
  }
  const double bytes = number * scale;
  LAYUP_CHECK(end != begin && scale > 0.0 && std::isfinite(bytes) && bytes >= 1.0 &&
                  bytes < static_cast<double>(std::numeric_limits<size_t>::max()),
              flag, " takes a positive size such as 16G, 512M or 1.5GiB (K, M, G, T: powers of ",
              "1024; KB, MB, GB, TB: powers of 1000); got '", text, "'");
  return static_cast<size_t>(bytes);
}

MemoryBudgets parse_memory_budgets(const std::string& memory_budget,
                                   const std::string& device_budget,
                                   const std::string& host_budget) {
  MemoryBudgets budgets;
  if (!memory_budget.empty()) budgets.total = parse_memory_size(memory_budget, "--memory-budget");
  if (!device_budget.empty()) budgets.device = parse_memory_size(device_budget, "--device-budget");
  if (!host_budget.empty()) budgets.host = parse_memory_size(host_budget, "--host-budget");
  return budgets;
}

MemoryBudgets with_machine_limit(MemoryBudgets budgets, const HostMemoryLimit& machine,
                                 bool allow_overcommit, const DeviceMemoryAttributes& gpu) {
  if (gpu.device == DeviceKind::kCuda && gpu.queried && !gpu.integrated && gpu.total_bytes > 0) {
    const size_t reserve = std::max(gpu.total_bytes / 50, size_t{1} << 30);
    budgets.machine_gpu = gpu.free_bytes > reserve ? gpu.free_bytes - reserve : 0;
    budgets.machine_gpu_source = format_bytes(*budgets.machine_gpu) + " (" + gpu.name + ": " +
                                 format_bytes(gpu.free_bytes) + " free of " +
                                 format_bytes(gpu.total_bytes) + ", less a reserve of " +
                                 format_bytes(reserve) + ")";
  }
  if (allow_overcommit) return budgets;
  const size_t usable = machine.usable_bytes();
  LAYUP_CHECK(!budgets.host || *budgets.host <= usable, "--host-budget ",
              format_bytes(*budgets.host),
              " is more than this machine's host memory can give the "
              "run: ",
              machine.describe(),
              ". A budget can only lower that limit; add "
              "--allow-overcommit to plan past it (with swap, say), at the risk of the kernel "
              "ending the run");
  budgets.machine_host = usable;
  budgets.machine_host_source = machine.describe();
  return budgets;
}

bool fits(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  return (!budgets.total || plan.total_bytes() <= *budgets.total) &&
         (!budgets.device || plan.bytes(MemorySide::kDevice) <= *budgets.device) &&
         (!budgets.host || plan.bytes(MemorySide::kHost) <= *budgets.host) &&
         (!budgets.machine_host || plan.host_memory_bytes() <= *budgets.machine_host) &&
         (!budgets.machine_gpu || plan.gpu_memory_bytes() <= *budgets.machine_gpu);
}

void check_budget(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  struct Limit {
    std::string name;
    std::optional<size_t> budget;
    std::optional<MemorySide> side;  // none: both sides together
    bool host_memory = false;        // the plan's bytes in host memory (the machine's limit)
    bool gpu_memory = false;         // the plan's bytes in the GPU's memory (what it has free)
  };
  const Limit limits[] = {
      {"--memory-budget", budgets.total, std::nullopt},
      {"--device-budget", budgets.device, MemorySide::kDevice},
      {"--host-budget", budgets.host, MemorySide::kHost},
      {"what this machine's host memory can give it, " + budgets.machine_host_source,
       budgets.machine_host, std::nullopt, true},
      {"what the GPU has free, " + budgets.machine_gpu_source, budgets.machine_gpu, std::nullopt,
       false, true}};
  for (const Limit& limit : limits) {
    if (!limit.budget) continue;
    // What this limit counts of a plan: the same measure for the plan and every offer below.
    const std::function<size_t(const MemoryPlan&)> need_of = [&](const MemoryPlan& p) {
      return limit.host_memory  ? p.host_memory_bytes()
             : limit.gpu_memory ? p.gpu_memory_bytes()
             : limit.side       ? p.bytes(*limit.side)
                                : p.total_bytes();
    };
    const size_t need = need_of(plan);
    if (need <= *limit.budget) continue;

    TensorClass largest = TensorClass::kWeights;
    size_t largest_bytes = 0;
    for (TensorClass c : kAllTensorClasses) {
      const size_t bytes = limit.side ? plan.bytes(*limit.side, c) : plan.bytes(c);
      if (bytes > largest_bytes) {
        largest = c;
        largest_bytes = bytes;
      }
    }
    std::string message = describe_run(plan.request) + " needs " + format_bytes(need);
    if (limit.host_memory)
      message += " of host memory at its peak (" + format_bytes(plan.transient_bytes()) +
                 " of it transient: the state on its way into the schedule or out to a "
                 "checkpoint)";
    else if (limit.gpu_memory)
      message += " of the GPU's memory";
    else if (limit.side)
      message += " on the " + side_word(*limit.side) + " side";
    else
      message += " (device side " + format_bytes(plan.bytes(MemorySide::kDevice)) +
                 " + host side " + format_bytes(plan.bytes(MemorySide::kHost)) + ")";
    const bool machine = limit.host_memory || limit.gpu_memory;  // the limit's name holds its bytes
    message += ", over " + limit.name + (machine ? "," : "") + " " +
               (machine ? "" : format_bytes(*limit.budget) + " ") + "by " +
               format_bytes(need - *limit.budget) + ". The largest class is " +
               tensor_class_label(largest) + ": " + format_bytes(largest_bytes);
    if (!limit.side)
      message += " (device side " + format_bytes(plan.bytes(MemorySide::kDevice, largest)) +
                 ", host side " + format_bytes(plan.bytes(MemorySide::kHost, largest)) + ")";
    message += ".";

    // What fits instead, each from a plan of its own: layup without the spare state of
    // speculative clipping, layup with the head's update on the host, then this mode with a
    // smaller batch.
    std::vector<std::string> changes;
    const auto offer = [&](const MemoryPlanRequest& changed, const std::string& flag) {
      const MemoryPlan changed_plan = plan_memory(changed);
      if (fits(changed_plan, budgets))
        changes.push_back(flag + " (needs " + format_bytes(need_of(changed_plan)) + ")");
    };
    if (plan.speculative_clip) {
      MemoryPlanRequest deferred = plan.request;
      deferred.layup_clip = LayupClip::kDeferred;
      offer(deferred, "--layup-clip deferred");
    }
    if (plan.head_on_device) {
      MemoryPlanRequest host_head = plan.request;
      host_head.layup_head = LayupHead::kHost;
      offer(host_head, "--layup-head host");
    }
    std::string floor;
    std::vector<Mode> order = {plan.request.mode};
    for (const auto& [mode, name] : kModeNames)
      if (mode != plan.request.mode) order.push_back(mode);
    for (const Mode mode : order) {
      size_t bytes = 0;
      const std::string change = fitting_change(plan.request, mode, budgets, need_of, &bytes);
      if (!change.empty()) {
        changes.push_back(change + " (needs " + format_bytes(bytes) + ")");
      } else {
        MemoryPlanRequest smallest = plan.request;
        smallest.mode = mode;
        smallest.place.clear();
        smallest.batch = smallest.seq_len = 1;
        floor += std::string(floor.empty() ? "" : ", ") +
                 format_bytes(need_of(plan_memory(smallest))) + " in " + name_of(mode) + " mode";
      }
    }
    if (!changes.empty()) {
      message += " Within the budget: ";
      for (size_t i = 0; i < changes.size(); ++i) message += (i ? "; or " : "") + changes[i];
      message += ".";
    }
    if (!floor.empty())
      message += " Even --batch 1 --seq-len 1 needs " + floor +
                 " (the model's state, almost no activations)" +
                 (!changes.empty() ? "."
                  : machine        ? "; choose a smaller --model or a machine with more memory."
                                   : "; choose a smaller --model or a larger budget.");
    message += "\n" + format_memory_plan(plan, budgets);
    fail(message);
  }
}

std::string format_memory_plan(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  const MemoryPlanRequest& r = plan.request;
  std::string text = "memory plan for " + describe_run(r) + ", computed before allocating:\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-6s  %-17s  %-8s  %10s  %-9s  %s\n", "side", "class", "kind",
                "bytes", "source", "what");
  text += line;
  for (const PlannedAllocation& a : plan.allocations) {
    const std::string& what = a.what;
    std::snprintf(line, sizeof line, "  %-6s  %-17s  %-8s  %10s  %-9s  %s\n",
                  side_word(a.side).c_str(), tensor_class_label(a.tensor_class),
                  memory_kind_name(a.kind), format_bytes(a.bytes).c_str(),
                  a.transient   ? "transient"
                  : a.accounted ? "accounted"
                                : "plan only",
                  what.c_str());
    text += line;
  }
  text += "  total: device side " + format_bytes(plan.bytes(MemorySide::kDevice)) +
          " + host side " + format_bytes(plan.bytes(MemorySide::kHost)) + " = " +
          format_bytes(plan.total_bytes()) + " at the peak (" +
          format_bytes(plan.transient_bytes()) + " of it transient)\n";
  text += "  host memory at the peak: " + format_bytes(plan.host_memory_bytes()) + "\n";
  text += "  weight grads on the device side: " +
          format_bytes(plan.bytes(MemorySide::kDevice, TensorClass::kWeightGrads)) + "\n";
  if (budgets.total)
    text +=
        "  budget: " + budget_line("--memory-budget", *budgets.total, plan.total_bytes()) + "\n";
  if (budgets.device)
    text += "  budget: " +
            budget_line("--device-budget", *budgets.device, plan.bytes(MemorySide::kDevice)) + "\n";
  if (budgets.host)
    text +=
        "  budget: " + budget_line("--host-budget", *budgets.host, plan.bytes(MemorySide::kHost)) +
        "\n";
  if (budgets.machine_host)
    text += "  this machine's host memory: " +
            budget_line("usable", *budgets.machine_host, plan.host_memory_bytes()) + " (" +
            budgets.machine_host_source + ")\n";
  if (budgets.machine_gpu)
    text += "  the GPU's free memory: " +
            budget_line("usable", *budgets.machine_gpu, plan.gpu_memory_bytes()) + " (" +
            budgets.machine_gpu_source + ")\n";
  text += "  placement: " + plan.placement.describe() + "\n";
  text += "  device: " + r.attributes.describe() + "\n";
  for (const std::string& note : plan.notes) text += "  note: " + note + "\n";
  return text;
}

std::string format_memory_report(const MemoryPlan& plan, const MemoryAccountant& accountant) {
  std::string text =
      "memory at the end of the run, measured by the accountant (every allocation through the "
      "device and the backend; current bytes by kind, and the peak):\n";
  text += accountant.report();
  char line[512];
  size_t planned_only = 0;
  for (const PlannedAllocation& a : plan.allocations) {
    if (a.accounted) continue;
    if (planned_only == 0) text += "planned only, NOT measured (nothing records these yet):\n";
    planned_only += a.bytes;
    std::snprintf(line, sizeof line, "  %-6s  %-17s  %-8s  %10s  %s\n", side_word(a.side).c_str(),
                  tensor_class_label(a.tensor_class), memory_kind_name(a.kind),
                  format_bytes(a.bytes).c_str(), a.what.c_str());
    text += line;
  }
  const MemoryUsage measured = accountant.total();
  text += "  measured peak " + format_bytes(measured.peak) + " + planned only " +
          format_bytes(planned_only) + " = " + format_bytes(measured.peak + planned_only) +
          " (the plan: " + format_bytes(plan.total_bytes()) + ")\n";

  // Each accounted cell of the plan against the accountant's peak of that cell.
  std::vector<std::string> differences;
  for (MemorySide side : kAllMemorySides)
    for (TensorClass c : kAllTensorClasses)
      for (MemoryKind kind : kAllMemoryKinds) {
        const size_t planned = plan.accounted_bytes(side, c, kind);
        const size_t peak = accountant.cell(side, c, kind).peak;
        if (planned == peak) continue;
        differences.push_back(side_word(side) + " side " + tensor_class_label(c) + " (" +
                              memory_kind_name(kind) + "): plan " + format_bytes(planned) +
                              ", measured peak " + format_bytes(peak));
      }
  if (differences.empty()) {
    text += "  plan vs measured: every accounted cell matches the plan exactly\n";
  } else {
    text += "  plan vs measured, where they differ:\n";
    for (const std::string& difference : differences) text += "    " + difference + "\n";
  }
  return text;
}

nlohmann::json memory_plan_json(const MemoryPlan& plan) {
  const MemoryPlanRequest& r = plan.request;
  nlohmann::json allocations = nlohmann::json::array();
  for (const PlannedAllocation& a : plan.allocations)
    allocations.push_back({{"side", side_word(a.side)},
                           {"class", tensor_class_name(a.tensor_class)},
                           {"kind", memory_kind_name(a.kind)},
                           {"bytes", a.bytes},
                           {"accounted", a.accounted},
                           {"what", a.what}});
  nlohmann::json by_class = nlohmann::json::object();
  for (TensorClass c : kAllTensorClasses)
    by_class[tensor_class_name(c)] = {{"device_bytes", plan.bytes(MemorySide::kDevice, c)},
                                      {"host_bytes", plan.bytes(MemorySide::kHost, c)}};
  nlohmann::json placement = nlohmann::json::object();
  for (TensorClass c : kAllTensorClasses)
    placement[tensor_class_name(c)] = memory_kind_name(plan.placement[c]);
  return {{"model", r.model_name},
          {"mode", name_of(r.mode)},
          {"device", name_of(r.device)},
          {"dtype", name_of(r.dtype)},
          {"batch", r.batch},
          {"seq_len", r.seq_len},
          {"grad_accum", r.grad_accum},
          {"recompute", r.recompute},
          {"head_on_device", plan.head_on_device},
          {"device_attributes", r.attributes.describe()},
          {"placement", placement},
          {"allocations", allocations},
          {"by_class", by_class},
          {"device_side_bytes", plan.bytes(MemorySide::kDevice)},
          {"host_side_bytes", plan.bytes(MemorySide::kHost)},
          {"total_bytes", plan.total_bytes()},
          {"notes", plan.notes}};
}

double weight_grad_device_reduction(const MemoryPlan& gpu, const MemoryPlan& layup) {
  return saved_fraction(layup.bytes(MemorySide::kDevice, TensorClass::kWeightGrads),
                        gpu.bytes(MemorySide::kDevice, TensorClass::kWeightGrads));
}

}  // namespace layup
