// The memory plan of a run: every buffer the run will allocate, by side, tensor class and memory
// kind, listed BEFORE anything is allocated by the components that allocate them (the schedule and
// its policies, the backend, the device: memory/planned_allocation.h) and summed here, then checked
// against the budgets (--memory-budget, --device-budget, --host-budget) and against what this
// machine has: its host memory (host_memory.h) and a discrete GPU's free memory (docs/running.md).
// engine/memory_planner.h gathers the lists; this layer only sums, checks and reports them.
//
// Buffers that go through a Device or a backend are also measured at run time by the
// MemoryAccountant (`accounted`); the rest (the state's transient copies, the token data, the
// process itself) is planned only, and every report says which is which.
//
// Placement (--place CLASS=KIND) sets the memory kind of a class's primary tensors: in `gpu` mode
// every class lives on the device side; in `offload` and `layup` the master weights and the AdamW
// moments live on the host side, the rest on the device side. A kind the device cannot use for
// that class is refused here, saying why. What each kind means for each schedule is in
// docs/memory.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/run_choices.h"
#include "memory/device_attributes.h"
#include "memory/host_memory.h"
#include "memory/memory_accountant.h"
#include "memory/place_override.h"
#include "memory/planned_allocation.h"
#include "memory/tensor_class.h"
#include "model/model_config.h"

namespace layup {

// The memory kind of each class's primary tensors.
struct Placement {
  std::array<MemoryKind, kTensorClassCount> kinds{};
  std::array<bool, kTensorClassCount> overridden{};  // set by --place

  MemoryKind operator[](TensorClass tensor_class) const { return kinds[index_of(tensor_class)]; }
  std::string describe() const;  // "weights=device, master=device, ..."
};

// The side a class's primary tensors live on in a mode (see the header comment).
MemorySide primary_side(Mode mode, TensorClass tensor_class);

// What the schedules allocate today: on cuda, device side = device, host side = host, except the
// master weights (pinned); on the CPU backend everything is host memory.
Placement default_placement(Mode mode, const DeviceMemoryAttributes& attributes);

// The default placement with the --place overrides applied in order. Throws layup::Error for a
// kind the device cannot use for that class, saying why.
Placement resolve_placement(Mode mode, const DeviceMemoryAttributes& attributes,
                            const std::vector<PlaceOverride>& overrides);

struct MemoryPlanRequest {
  ModelConfig config;
  std::string model_name = "custom";
  int batch = 1;    // B
  int seq_len = 1;  // T
  int grad_accum = 1;
  float clip = 1.0f;  // global-norm clip threshold; <= 0: none
  // How layup clips and where it updates the head (docs/schedules.md); auto is resolved against
  // the device by the schedule's choice (schedule/schedule_plan.h).
  LayupClip layup_clip = LayupClip::kAuto;
  LayupHead layup_head = LayupHead::kAuto;
  OptimizerPlacement optimizer_placement;  // layup; auto is resolved by plan_run
  // How AdamW keeps its moments (docs/optimizer_state.md); never chosen by the planner, since
  // bf16 and 8bit are lossy.
  OptimizerStateKind optimizer_state = OptimizerStateKind::kFp32;
  // How offload and layup sum the micro-batches (docs/schedules.md): layer-major keeps each
  // micro-batch's block inputs and sums on the device, and the host keeps no sum.
  Accumulation accumulation = Accumulation::kAuto;
  // offload and layup: the host-updated blocks whose compute weights are streamed to the device
  // block by block (docs/memory.md, "Streamed weights"); auto is resolved by plan_run.
  StreamedBlocks streamed_blocks;
  std::string offload_dir;  // layup: where blocks placed on disk keep their state
  Mode mode = Mode::kGpu;
  DeviceKind device = DeviceKind::kCpu;  // resolved: cpu or cuda
  Dtype dtype = Dtype::kFp32;            // resolved: fp32, or bf16 on cuda
  int recompute = 0;                     // the CUDA backend's --recompute level
  std::vector<PlaceOverride> place;      // --place overrides, in order
  DeviceMemoryAttributes attributes = cpu_memory_attributes();
  size_t data_bytes = 0;  // the token shards the run reads into memory (0: none or unknown)
  // The run saves or resumes checkpoints (`train`), which stream one span's state at a time
  // through the checkpoint writer's or reader's scratch; else only the span's state on its way in
  // (`bench` initialises span by span and saves nothing).
  bool streams_checkpoints = true;
  // The ranks `mpirun` started: gpu mode splits the AdamW moments across them (ZeRO-1).
  int ranks = 1;
};

// A flag the user could add, and the request it makes.
struct PlanAlternative {
  std::string flag;
  MemoryPlanRequest request;
};

struct MemoryPlan {
  MemoryPlanRequest request;
  Placement placement;
  std::vector<PlannedAllocation> allocations;
  std::vector<std::string> notes;  // what is not applied, not counted, or measured only
  // What the planner would choose instead to need less (layup's deferred clipping, say), offered
  // by check_budget when they fit.
  std::vector<PlanAlternative> alternatives;
  // The file the disk tier keeps under request.offload_dir (0: no block on disk).
  size_t disk_bytes = 0;

  // A side's and the whole plan's bytes at the peak (transients included); a class's bytes (its
  // steady buffers: transients are not a class's).
  size_t bytes(MemorySide side) const;
  size_t bytes(MemorySide side, TensorClass tensor_class) const;
  size_t bytes(TensorClass tensor_class) const;  // both sides
  size_t total_bytes() const;
  size_t transient_bytes() const;
  // The plan's bytes in the host's physical memory at the peak: host, pinned and pageable memory
  // on either side (on the CPU backend and an integrated GPU, everything), transients included.
  size_t host_memory_bytes() const;
  // The plan's bytes in a discrete GPU's own memory: device and managed memory (0 on the CPU
  // backend and an integrated GPU, whose memory is the host's).
  size_t gpu_memory_bytes() const;
  // What the accountant should find in one of its cells: the accounted allocations there.
  size_t accounted_bytes(MemorySide side, TensorClass tensor_class, MemoryKind kind) const;
};

// The plan of another request (engine/memory_planner.h's plan_memory), for what fits instead.
using Replan = std::function<MemoryPlan(const MemoryPlanRequest&)>;

// Budgets in bytes; unset means no limit. total counts device and host bytes together, as on a
// unified-memory board (a Jetson Orin NX has 16 GB for everything). machine_host is what this
// machine's host memory can give the run (memory/host_memory.h), checked against the plan's
// host_memory_bytes(), and machine_gpu what a discrete GPU has free, checked against
// gpu_memory_bytes(); with_machine_limit sets them.
struct MemoryBudgets {
  std::optional<size_t> total, device, host;
  // Of `device`, what a plan may not take (device_budget_reserve where the device is a GPU).
  size_t device_reserve = 0;
  // What the device side of a plan may take: `device` less its reserve.
  std::optional<size_t> device_limit() const {
    if (!device) return std::nullopt;
    return *device - std::min(*device, device_reserve);
  }
  std::optional<size_t> machine_host, machine_gpu;
  std::string machine_host_source, machine_gpu_source;  // where they come from, for messages
  // What the file system under --offload-dir can take (free less a reserve), checked against the
  // plan's disk_bytes; disk_source describes it (tier/disk_space.h).
  std::optional<size_t> disk;
  std::string disk_source;
  bool any() const { return total || device || host; }
  std::string describe() const;  // "--memory-budget 16.00 GiB" ...
};

// `budgets` with this machine's host memory as one more limit, and a discrete GPU's free memory
// (gpu: attributes read from the driver; less a reserve of 2%, at least 1 GiB, for the CUDA
// context and what cuDNN sizes at run time) as another; on a discrete GPU a --device-budget keeps
// its device_budget_reserve. A --host-budget above what the machine
// has is refused (it can only lower the limit) unless allow_overcommit, which also drops the
// host's limit: the kernel may then end the run.
MemoryBudgets with_machine_limit(MemoryBudgets budgets, const HostMemoryLimit& machine,
                                 bool allow_overcommit, const DeviceMemoryAttributes& gpu = {});

// What a --device-budget on a GPU keeps back from the plan: the budget stands for a card of that
// size, whose CUDA context and library handles live outside the plan (0.5 GiB) and whose check
// leaves the reserve a real card's leaves (2%, at least 1 GiB) for what cuDNN sizes at run time.
size_t device_budget_reserve(size_t budget);

// A size as the budget flags take it: a number (fractions allowed) with an optional unit: K, M,
// G, T (powers of 1024; KiB, MiB, GiB, TiB the same), KB, MB, GB, TB (powers of 1000), or B /
// none for bytes: "16G", "512M", "1.5GiB", "16GB". Throws layup::Error naming the flag.
size_t parse_memory_size(const std::string& text, const std::string& flag);

// Parses the three flags' values; empty strings mean unset.
MemoryBudgets parse_memory_budgets(const std::string& memory_budget,
                                   const std::string& device_budget,
                                   const std::string& host_budget);

// Whether the plan is within every budget.
bool fits(const MemoryPlan& plan, const MemoryBudgets& budgets);

// The largest batch below request.batch whose plan (replan) fits `budgets`, 0 where not even 1
// does. Plans about log2(request.batch) times, whatever the batch.
int largest_fitting_batch(const MemoryPlanRequest& request, const MemoryBudgets& budgets,
                          const Replan& replan);

// Throws layup::Error when the plan exceeds a budget: the message names the budget, the bytes the
// plan needs, the largest class and its bytes, and what would fit instead (another mode, a
// smaller --batch or --seq-len), each computed from its own plan; then the plan itself.
void check_budget(const MemoryPlan& plan, const MemoryBudgets& budgets, const Replan& replan);

// The start-of-run report: one line per allocation (side, class, kind, bytes, measured or planned
// only, what it is), the totals, the budgets, the placement and the notes.
std::string format_memory_plan(const MemoryPlan& plan, const MemoryBudgets& budgets = {});

// The end-of-run report: what the accountant measured (current and peak by class and kind), the
// planned-only allocations labelled as planned, and where plan and measurement differ.
std::string format_memory_report(const MemoryPlan& plan, const MemoryAccountant& accountant);

nlohmann::json memory_plan_json(const MemoryPlan& plan);

// Device-side weight-gradient bytes of `layup` relative to `gpu` for the same request: the
// fraction saved (0.864 = 86.4% less).
double weight_grad_device_reduction(const MemoryPlan& gpu, const MemoryPlan& layup);

}  // namespace layup
