// What every schedule shares: tracing's device track, the whole state through span exports, and
// the choice of a schedule by mode name.
#include "schedule/schedule.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/run_choices.h"
#include "model/init.h"
#include "optim/host_adamw.h"
#include "schedule/mode_schedules.h"
#include "schedule/weight_ring.h"
#include "trace/trace_recorder.h"

namespace layup {

int device_track(TraceRecorder* recorder) {
  return recorder != nullptr ? recorder->track("GPU") : 0;
}

OptimizerTensors fresh_optimizer_tensors(const ParameterLayout& layout, uint64_t seed) {
  OptimizerTensors fresh;
  fresh.params.resize(layout.total_count());
  init_parameters(layout, fresh.params.data(), seed);
  fresh.adam_m.assign(layout.total_count(), 0.0f);
  fresh.adam_v.assign(layout.total_count(), 0.0f);
  return fresh;
}

OptimizerTensors Schedule::export_tensors() const {
  const size_t n = layout().total_count();
  OptimizerTensors tensors{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (size_t index = 0; index < layout().spans().size(); ++index) {
    const size_t at = layout().spans()[index].offset;
    export_span(index, {tensors.params.data() + at, tensors.adam_m.data() + at,
                        tensors.adam_v.data() + at});
  }
  return tensors;
}

void Schedule::import_tensors(const OptimizerTensors& tensors) {
  const size_t n = layout().total_count();
  LAYUP_CHECK(
      tensors.params.size() == n && tensors.adam_m.size() == n && tensors.adam_v.size() == n,
      "model state has ", tensors.params.size(), " parameters but the model needs ", n);
  for (size_t index = 0; index < layout().spans().size(); ++index) {
    const size_t at = layout().spans()[index].offset;
    import_span(index, {tensors.params.data() + at, tensors.adam_m.data() + at,
                        tensors.adam_v.data() + at});
  }
}

void Schedule::initialize_fresh(uint64_t seed,
                                const std::function<void(size_t, size_t)>& spans_done) {
  size_t largest = 0;
  for (const Span& span : layout().spans()) largest = std::max(largest, span.count);
  std::vector<float> params(largest);
  // Fresh moments are zero, and all-zero bytes are the zero state of every kind
  // (optim/adamw_moments.h): a compact kind's go in coded, in its own bytes, not fp32 m and v.
  const OptimizerStateKind kind = optimizer_state();
  const bool fp32 = kind == OptimizerStateKind::kFp32;
  const std::vector<float> zeros(
      fp32 ? largest : optimizer_moments_padded_bytes(kind, largest) / sizeof(float), 0.0f);
  for (size_t index = 0; index < layout().spans().size(); ++index) {
    init_span_parameters(layout(), index, params.data(), seed);
    if (fp32)
      import_span(index, {params.data(), zeros.data(), zeros.data()});
    else
      import_span(index, {params.data(), nullptr, nullptr, zeros.data()});
    if (spans_done) spans_done(index + 1, layout().spans().size());
  }
}

std::vector<UpdateSite> head_on_device(const ParameterLayout& layout) {
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kHost);
  sites.front() = sites.back() = UpdateSite::kDevice;  // the embeddings, the final norm
  return sites;
}

namespace {

// Device memory that is host memory (the CPU backend): the communicator sums it where it is.
class HostMemoryCollectives final : public DeviceCollectives {
 public:
  explicit HostMemoryCollectives(Communicator& ranks) : ranks_(ranks) {}
  void sum_in_rank_order(float* data, size_t count) override {
    ranks_.sum_in_rank_order(data, count);
  }
  void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) override {
    ranks_.reduce_scatter_in_rank_order(data, bounds);
  }
  void all_gather(float* data, std::span<const size_t> bounds) override {
    ranks_.all_gather(data, bounds);
  }

 private:
  Communicator& ranks_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> join_device_collectives(Device& device, Communicator& ranks) {
  if (device.kinds().own == MemoryKind::kHost)
    return std::make_unique<HostMemoryCollectives>(ranks);
  // NCCL's unique id: 128 bytes (ncclUniqueId), the size every rank receives it in.
  constexpr size_t kIdBytes = 128;
  std::vector<uint8_t> id =
      ranks.rank() == 0 ? device.new_collectives_id() : std::vector<uint8_t>(kIdBytes);
  LAYUP_CHECK(id.size() == kIdBytes, "internal error: a collectives id of ", id.size(), " bytes");
  ranks.broadcast(id, 0);
  return device.join_collectives(id, ranks.rank(), ranks.size());
}

PlannedAllocation placed_buffer(const ScheduleOptions& options, DeviceKinds kinds, size_t count,
                                TensorClass tensor_class, MemorySide side, std::string what) {
  // Device side: the device's own memory. Host side: the master weights where the device copies
  // from fastest (it reads them after every update), the moments, which only the CPU touches, in
  // plain host memory.
  const MemoryKind fallback = side == MemorySide::kDevice                   ? kinds.own
                              : tensor_class == TensorClass::kMasterWeights ? kinds.host_copy
                                                                            : MemoryKind::kHost;
  return {side, tensor_class, options.kind_of(tensor_class, fallback), count * sizeof(float),
          std::move(what)};
}

BufferList schedule_buffers(Mode mode, const ParameterLayout& layout,
                            const ScheduleOptions& options, DeviceKinds kinds, int micro_batches) {
  switch (mode) {
    case Mode::kGpu:
      return gpu_schedule_buffers(layout, options, kinds, micro_batches);
    case Mode::kOffload:
      return offload_schedule_buffers(layout, options, kinds, micro_batches);
    case Mode::kLayup:
      return layup_schedule_buffers(layout, options, kinds, micro_batches);
  }
  fail("no schedule for mode ", static_cast<int>(mode));
}

std::unique_ptr<Schedule> make_schedule(Mode mode, std::unique_ptr<ModelBackend> backend,
                                        std::unique_ptr<Device> device,
                                        const ParameterLayout& layout,
                                        const ScheduleOptions& options) {
  switch (mode) {
    case Mode::kGpu:
      return make_gpu_schedule(std::move(backend), std::move(device), layout, options);
    case Mode::kOffload:
      return make_offload_schedule(std::move(backend), std::move(device), layout, options);
    case Mode::kLayup:
      return make_layup_schedule(std::move(backend), std::move(device), layout, options);
  }
  fail("no schedule for mode ", static_cast<int>(mode));
}

namespace {

// The spans at `site` named by runs, in layout order (the embeddings, the blocks, the final
// norm): "the embeddings", "block 3", "blocks 0-18".
std::vector<std::string> name_spans_at(const std::vector<UpdateSite>& sites, UpdateSite site) {
  std::vector<std::string> names;
  for (size_t index = 0; index < sites.size(); ++index) {
    if (sites[index] != site) continue;
    if (index == 0 || index + 1 == sites.size()) {
      names.emplace_back(index == 0 ? "the embeddings" : "the final norm");
      continue;
    }
    size_t last = index;
    while (last + 2 < sites.size() && sites[last + 1] == site) ++last;
    // Appended piece by piece: `"block " + std::to_string(...)` trips GCC 12's -Wrestrict.
    std::string name = last == index ? "block " : "blocks ";
    name += std::to_string(index - 1);
    if (last > index) {
      name += '-';
      name += std::to_string(last - 1);
    }
    names.push_back(std::move(name));
    index = last;
  }
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " and " : ", ";
    text += names[i];
  }
  return text;
}

// "; blocks 1, 3 and 5 are staged ...": the staged blocks of `sites`, or "" where none is.
std::string describe_staged(const std::vector<UpdateSite>& sites) {
  const std::vector<std::string> staged = name_spans_at(sites, UpdateSite::kStaged);
  if (staged.empty()) return "";
  return "; " + join_names(staged) +
         " keep their optimizer state on the host and are updated by the device's AdamW, their "
         "gradient and state staged through slots in its memory";
}

// Where layup's spans are updated, from ScheduleOptions::update_sites.
std::string describe_update_sites(const std::vector<UpdateSite>& sites) {
  const std::vector<std::string> on_device = name_spans_at(sites, UpdateSite::kDevice);
  const std::vector<std::string> on_disk = name_spans_at(sites, UpdateSite::kDisk);
  std::string disk;
  if (!on_disk.empty())
    disk = "; " + join_names(on_disk) + " keep their optimizer state on disk (--offload-dir), " +
           "read ahead and written back around their CPU update";
  disk += describe_staged(sites);
  if (on_device.empty())
    return "the embeddings and the final norm are updated on the CPU once their gradient is "
           "complete" +
           disk;
  const bool head_only = on_device.size() == 2 && sites.front() == UpdateSite::kDevice &&
                         sites.back() == UpdateSite::kDevice;
  if (head_only)
    return "the embeddings and the final norm are updated on the device, where their gradient "
           "is (--layup-head host: on the CPU)" +
           disk;
  std::string text = join_names(on_device);
  text += on_device.size() == 1 ? " is" : " are";
  text += " updated on the device, where its gradient is; the other spans on the CPU";
  return text + disk;
}

// describe_schedule's line before the optimizer state.
std::string describe_mode(Mode mode, const ScheduleOptions& options, float clip_max_norm) {
  if (mode == Mode::kGpu)
    return "gpu: weights, gradients and AdamW state on the device; AdamW after backward";
  const int workers = options.cpu_workers > 0 ? options.cpu_workers : allowed_core_count();
  std::ostringstream text;
  text << name_of(mode) << " with " << workers << " CPU worker" << (workers == 1 ? "" : "s")
       << ": ";
  if (mode == Mode::kOffload) {
    text << "full backward on the device, gradients copied to the host, AdamW on the CPU after "
            "backward (no overlap)"
         << describe_staged(options.update_sites);
    return text.str();
  }
  text << "block gradients through two slots to the CPU, AdamW per block on the CPU; ";
  if (clip_max_norm > 0.0f && options.speculative_clip)
    text << "clipping at " << clip_max_norm
         << " is exact by speculation: each block's update overlaps the backward of the blocks "
            "below it as if the step were unclipped, into a second copy of the state; a step "
            "whose global norm calls for clipping updates its blocks again from the first copy, "
            "during the next forward, and the step after it does not speculate (a non-finite "
            "step changes nothing)";
  else if (clip_max_norm > 0.0f)
    text << "clipping at " << clip_max_norm
         << " is exact, deferred: the global norm is known at the end of backward, then the "
            "block updates run in forward order during the next forward, block l's forward "
            "waiting only for block l's update (--layup-clip speculative overlaps them with "
            "backward)";
  else
    text << "no clipping, so each block's update overlaps the backward of the blocks below it "
            "(if a gradient turns out non-finite, the step is not applied, but the blocks whose "
            "own gradient was finite were already updated)";
  text << "; " << describe_update_sites(options.update_sites);
  return text.str();
}

}  // namespace

std::string describe_optimizer_state(OptimizerStateKind kind) {
  switch (kind) {
    case OptimizerStateKind::kFp32:
      return "optimizer state: fp32";
    case OptimizerStateKind::kBf16:
      return "optimizer state: bf16 (moments rounded to bfloat16, lossy; "
             "docs/optimizer_state.md)";
    case OptimizerStateKind::kBlockwise8Bit:
      return "optimizer state: 8bit (blockwise 8-bit moments, lossy; docs/optimizer_state.md)";
  }
  fail("unknown optimizer state kind");
}

std::string describe_schedule(Mode mode, const ScheduleOptions& options, float clip_max_norm) {
  std::string text = describe_mode(mode, options, clip_max_norm);
  if (mode != Mode::kGpu && options.accumulation == Accumulation::kLayerMajor)
    text +=
        "; micro-batches layer-major (each block's backward of every micro-batch in turn, "
        "summed on the device)";
  if (mode != Mode::kGpu && options.streamed_blocks > 0)
    text += "; the last " + std::to_string(options.streamed_blocks) +
            " host-updated blocks' weights streamed to the device through a ring of " +
            std::to_string(WeightRing::slot_count(options)) + " slots";
  return text + "; " + describe_optimizer_state(options.optimizer_state);
}

}  // namespace layup
