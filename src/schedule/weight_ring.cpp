// WeightRing: which blocks are streamed, the ring's buffer and its fills.
#include "schedule/weight_ring.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

std::vector<char> WeightRing::streamed_spans(const ParameterLayout& layout,
                                             const std::vector<UpdateSite>& sites,
                                             int streamed_blocks) {
  std::vector<char> streamed(layout.spans().size(), 0);
  LAYUP_CHECK(streamed_blocks >= 0, "--streamed-blocks must be 0 or more (got ", streamed_blocks,
              ")");
  if (streamed_blocks == 0) return streamed;
  // The last blocks whose update the host runs (by the CPU, staged through the device, or from
  // disk): above the device-updated ones; those on disk, the last, first.
  std::vector<size_t> host_blocks;
  for (size_t index = 1; index + 1 < layout.spans().size(); ++index)
    if (sites.empty() || sites[index] != UpdateSite::kDevice) host_blocks.push_back(index);
  LAYUP_CHECK(static_cast<size_t>(streamed_blocks) <= host_blocks.size(), "--streamed-blocks ",
              streamed_blocks, " streams more blocks than the ", host_blocks.size(),
              " whose update the host runs (a block updated on the device keeps its weights "
              "there); use --streamed-blocks ",
              host_blocks.size(), " or fewer");
  for (size_t j = host_blocks.size() - streamed_blocks; j < host_blocks.size(); ++j)
    streamed[host_blocks[j]] = 1;
  return streamed;
}

std::vector<char> WeightRing::compute_copies_in_ring(const ParameterLayout& layout,
                                                     const ScheduleOptions& options) {
  if (!options.weights_land_in_compute_copy || options.streamed_blocks == 0) return {};
  return streamed_spans(layout, options.update_sites, options.streamed_blocks);
}

int WeightRing::slot_count(const ScheduleOptions& options) {
  return std::max(1, std::min(options.stream_slots, options.streamed_blocks));
}

size_t WeightRing::element_bytes(const ScheduleOptions& options) {
  return options.weights_land_in_compute_copy ? 2 : sizeof(float);
}

namespace {

// A slot's stride: one block's weights, rounded up so that every slot starts 256-byte aligned,
// as the backend's own buffers do (its matmuls read the weights with wide loads).
size_t slot_bytes(const ParameterLayout& layout, size_t element_bytes) {
  constexpr size_t kAlign = 256;
  return (layout.block().count * element_bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

std::optional<PlannedAllocation> WeightRing::buffer(const ParameterLayout& layout,
                                                    const ScheduleOptions& options,
                                                    DeviceKinds kinds) {
  if (options.streamed_blocks == 0) return std::nullopt;
  LAYUP_CHECK(options.stream_slots >= 1, "a weight ring needs at least one slot (got ",
              options.stream_slots, ")");
  const int slots = slot_count(options);
  const size_t element = element_bytes(options);
  return PlannedAllocation{MemorySide::kDevice, TensorClass::kWeights, kinds.own,
                           static_cast<size_t>(slots) * slot_bytes(layout, element),
                           "weight ring: " + std::to_string(slots) + " slots of one block's " +
                               (element == 2 ? "bf16" : "fp32") +
                               " weights, filled from the host for the " +
                               std::to_string(options.streamed_blocks) + " streamed blocks"};
}

WeightRing::WeightRing(Device& device, const ParameterLayout& layout,
                       const ScheduleOptions& options)
    : device_(device),
      layout_(layout),
      streamed_(streamed_spans(layout, options.update_sites, options.streamed_blocks)),
      slots_(slot_count(options)),
      element_bytes_(element_bytes(options)) {
  if (const std::optional<PlannedAllocation> listed = buffer(layout, options, device.kinds())) {
    ring_ = device_.allocate(*listed);
    slot_bytes_ = slot_bytes(layout, element_bytes_);
  }
}

void* WeightRing::slot(size_t span) const {
  LAYUP_CHECK(streams(span), "internal error: span ", span, " is not streamed");
  return reinterpret_cast<char*>(ring_.data()) +
         static_cast<size_t>(layout_.spans()[span].layer % slots_) * slot_bytes_;
}

WeightRing::Filled WeightRing::fill_async(size_t span, const void* source,
                                          std::shared_ptr<const DeviceFence> after,
                                          std::function<void()> ready) {
  auto done = std::make_shared<std::promise<std::shared_ptr<const DeviceFence>>>();
  Filled filled = done->get_future().share();
  thread_.submit([this, span, source, after = std::move(after), ready = std::move(ready), done] {
    try {
      ready();
      done->set_value(fill(span, source, after.get()));
    } catch (...) {
      done->set_exception(std::current_exception());  // the reader rethrows it
    }
  });
  return filled;
}

void WeightRing::fill_now(size_t span, const void* source) {
  device_.order_after(*fill(span, source, device_.fence().get()));
}

void WeightRing::set_trace(TraceRecorder* recorder, int track) {
  trace_ = recorder;
  track_ = track;
}

std::shared_ptr<const DeviceFence> WeightRing::fill(size_t span, const void* source,
                                                    const DeviceFence* after) {
  const Span& s = layout_.spans()[span];
  TraceSpan traced(trace_, track_, trace_name(TaskKind::kWeightsIn, s.kind), s.layer);
  return device_.copy_to_device_after(after, slot(span), source, s.count * element_bytes_);
}

}  // namespace layup
