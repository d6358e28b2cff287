// The memory plan: placement, the sums of the buffers the components list, budgets and reports.
#include "memory/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>

#include "core/error.h"

namespace layup {

namespace {

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
                           const Replan& replan,
                           const std::function<size_t(const MemoryPlan&)>& need, size_t* bytes) {
  MemoryPlanRequest request = base;
  request.mode = mode;
  // Placement does not change how many bytes a plan needs, and a --place valid in one mode may not
  // be in another (the master weights change sides).
  request.place.clear();
  // Another mode plans with the planner's choices of where the optimizer state lives (only layup
  // places it) and of the blocks streamed (none in gpu mode).
  if (mode != base.mode) request.optimizer_placement = {};
  if (mode != base.mode) request.streamed_blocks = {};
  auto try_plan = [&](int batch, int seq_len) {
    request.batch = batch;
    request.seq_len = seq_len;
    const MemoryPlan plan = replan(request);
    *bytes = need(plan);
    return fits(plan, budgets);
  };
  const std::string mode_flag = mode == base.mode ? "" : "--mode " + name_of(mode);
  auto with_mode = [&](const std::string& rest) {
    return mode_flag.empty() ? rest : rest.empty() ? mode_flag : mode_flag + " " + rest;
  };
  if (mode != base.mode && try_plan(base.batch, base.seq_len)) return with_mode("");
  request.seq_len = base.seq_len;
  if (const int batch = largest_fitting_batch(request, budgets, replan); batch > 0) {
    try_plan(batch, base.seq_len);
    return with_mode("--batch " + std::to_string(batch));
  }
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
                            const std::vector<PlaceOverride>& overrides) {
  Placement placement = default_placement(mode, attributes);
  for (const PlaceOverride& place : overrides) {
    const std::string why = why_not(mode, attributes, place.tensor_class, place.kind);
    LAYUP_CHECK(
        why.empty(), "--place ", place.name(), " is refused on ", name_of(attributes.device),
        attributes.device == DeviceKind::kCuda ? " (" + attributes.name + ")" : "", ": ", why);
    placement.kinds[index_of(place.tensor_class)] = place.kind;
    placement.overridden[index_of(place.tensor_class)] = true;
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

namespace {
// A GPU's free memory less this is what a plan may take (with_machine_limit).
size_t card_reserve(size_t total) {
  return std::max(total / 50, size_t{1} << 30);
}
}  // namespace

size_t device_budget_reserve(size_t budget) {
  constexpr size_t kContextAndHandles = size_t{512} << 20;
  return kContextAndHandles + card_reserve(budget);
}

MemoryBudgets with_machine_limit(MemoryBudgets budgets, const HostMemoryLimit& machine,
                                 bool allow_overcommit, const DeviceMemoryAttributes& gpu) {
  if (budgets.device && gpu.device == DeviceKind::kCuda && !gpu.integrated)
    budgets.device_reserve = device_budget_reserve(*budgets.device);
  if (gpu.device == DeviceKind::kCuda && gpu.queried && !gpu.integrated && gpu.total_bytes > 0) {
    const size_t reserve = card_reserve(gpu.total_bytes);
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

int largest_fitting_batch(const MemoryPlanRequest& request, const MemoryBudgets& budgets,
                          const Replan& replan) {
  // A plan's bytes grow with the batch: bisection, so that the time does not grow with it.
  MemoryPlanRequest probe = request;
  int lo = 0, hi = request.batch;  // fits(lo) or lo == 0; !fits(hi), never planned
  while (hi - lo > 1) {
    probe.batch = lo + (hi - lo) / 2;
    (fits(replan(probe), budgets) ? lo : hi) = probe.batch;
  }
  return lo;
}

bool fits(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  return (!budgets.total || plan.total_bytes() <= *budgets.total) &&
         (!budgets.device || plan.bytes(MemorySide::kDevice) <= *budgets.device_limit()) &&
         (!budgets.host || plan.bytes(MemorySide::kHost) <= *budgets.host) &&
         (!budgets.machine_host || plan.host_memory_bytes() <= *budgets.machine_host) &&
         (!budgets.machine_gpu || plan.gpu_memory_bytes() <= *budgets.machine_gpu) &&
         (!budgets.disk || plan.disk_bytes <= *budgets.disk);
}

void check_budget(const MemoryPlan& plan, const MemoryBudgets& budgets, const Replan& replan) {
  struct Limit {
    std::string name;
    std::optional<size_t> budget;
    std::optional<MemorySide> side;  // none: both sides together
    bool host_memory = false;        // the plan's bytes in host memory (the machine's limit)
    bool gpu_memory = false;         // the plan's bytes in the GPU's memory (what it has free)
    bool disk = false;               // the plan's bytes on disk (under --offload-dir)
    bool bytes_in_name = false;      // the name says the limit's bytes (as the machine's do)
  };
  const Limit limits[] = {
      {"--memory-budget", budgets.total, std::nullopt},
      {budgets.device_reserve > 0
           ? "what --device-budget " + format_bytes(*budgets.device) + " leaves a plan, " +
                 format_bytes(*budgets.device_limit()) + " (less " +
                 format_bytes(budgets.device_reserve) +
                 " for the CUDA context, the libraries' handles and cuDNN's run-time workspace)"
           : std::string("--device-budget"),
       budgets.device_limit(), MemorySide::kDevice, false, false, false,
       budgets.device_reserve > 0},
      {"--host-budget", budgets.host, MemorySide::kHost},
      {"what this machine's host memory can give it, " + budgets.machine_host_source,
       budgets.machine_host, std::nullopt, true},
      {"what the GPU has free, " + budgets.machine_gpu_source, budgets.machine_gpu, std::nullopt,
       false, true},
      {"what the disk under --offload-dir can take, " + budgets.disk_source, budgets.disk,
       std::nullopt, false, false, true}};
  for (const Limit& limit : limits) {
    if (!limit.budget) continue;
    // What this limit counts of a plan: the same measure for the plan and every offer below.
    const std::function<size_t(const MemoryPlan&)> need_of = [&](const MemoryPlan& p) {
      return limit.host_memory  ? p.host_memory_bytes()
             : limit.gpu_memory ? p.gpu_memory_bytes()
             : limit.disk       ? p.disk_bytes
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
    else if (limit.disk)
      message +=
          " on disk for the optimizer state of the blocks placed there (--optimizer-placement " +
          plan.request.optimizer_placement.name() + ")";
    else if (limit.side)
      message += " on the " + side_word(*limit.side) + " side";
    else
      message += " (device side " + format_bytes(plan.bytes(MemorySide::kDevice)) +
                 " + host side " + format_bytes(plan.bytes(MemorySide::kHost)) + ")";
    // The limit's name holds its bytes.
    const bool machine = limit.host_memory || limit.gpu_memory || limit.disk || limit.bytes_in_name;
    message += ", over " + limit.name + (machine ? "," : "") + " " +
               (machine ? "" : format_bytes(*limit.budget) + " ") + "by " +
               format_bytes(need - *limit.budget) + ".";
    if (limit.disk)
      fail(message,
           " Free space there, give --offload-dir a directory on a larger file system, or place "
           "fewer blocks on disk (--optimizer-placement auto places as few as the memory "
           "budgets allow).\n",
           format_memory_plan(plan, budgets));
    message.pop_back();
    message += std::string(". The largest class is ") + tensor_class_label(largest) + ": " +
               format_bytes(largest_bytes);
    if (!limit.side)
      message += " (device side " + format_bytes(plan.bytes(MemorySide::kDevice, largest)) +
                 ", host side " + format_bytes(plan.bytes(MemorySide::kHost, largest)) + ")";
    message += ".";

    // What fits instead, each from a plan of its own: the planner's alternatives to its choices
    // (layup without the spare state of speculative clipping, say), then each mode with a
    // smaller batch.
    std::vector<std::string> changes;
    for (const PlanAlternative& alternative : plan.alternatives) {
      const MemoryPlan changed_plan = replan(alternative.request);
      if (fits(changed_plan, budgets))
        changes.push_back(alternative.flag + " (needs " + format_bytes(need_of(changed_plan)) +
                          ")");
    }
    std::string floor;
    std::vector<Mode> order = {plan.request.mode};
    for (const auto& [mode, name] : kModeNames)
      if (mode != plan.request.mode) order.push_back(mode);
    for (const Mode mode : order) {
      size_t bytes = 0;
      const std::string change =
          fitting_change(plan.request, mode, budgets, replan, need_of, &bytes);
      if (!change.empty()) {
        changes.push_back(change + " (needs " + format_bytes(bytes) + ")");
      } else {
        MemoryPlanRequest smallest = plan.request;
        smallest.mode = mode;
        smallest.place.clear();
        if (mode != plan.request.mode) smallest.optimizer_placement = {};
        if (mode != plan.request.mode) smallest.streamed_blocks = {};
        smallest.batch = smallest.seq_len = 1;
        floor += std::string(floor.empty() ? "" : ", ") + format_bytes(need_of(replan(smallest))) +
                 " in " + name_of(mode) + " mode";
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
  if (budgets.device) {
    text += "  budget: " + budget_line("--device-budget", *budgets.device_limit(),
                                       plan.bytes(MemorySide::kDevice));
    if (budgets.device_reserve > 0)
      text += " (of " + format_bytes(*budgets.device) + ", less " +
              format_bytes(budgets.device_reserve) +
              " kept for the CUDA context, the libraries' handles and cuDNN's run-time workspace)";
    text += "\n";
  }
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
  if (plan.disk_bytes > 0)
    text += "  on disk under " + r.offload_dir + ": " + format_bytes(plan.disk_bytes) +
            (r.ranks > 1 ? " (one rank's file, the largest: each rank keeps its own)\n"
                         : " (the optimizer state of the blocks placed there)\n");
  if (budgets.disk)
    text += "  the disk's free space: " + budget_line("usable", *budgets.disk, plan.disk_bytes) +
            " (" + budgets.disk_source + ")\n";
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
    if (planned_only == 0)
      text += "planned only, NOT measured (held outside the device and the backends):\n";
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
