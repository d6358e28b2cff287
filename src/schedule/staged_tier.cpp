// StagedTier: the device's AdamW on blocks whose state the host keeps (staged_tier.h).
#include "schedule/staged_tier.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "core/error.h"
#include "schedule/weight_ring.h"

namespace layup {

namespace {

// A slot's stride in floats: every slot starts 256-byte aligned, so the AdamW kernels' wide loads
// apply as they do on the spans' own buffers.
size_t slot_stride(size_t floats) {
  constexpr size_t kAlignFloats = 64;
  return (floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
}

size_t largest_staged_span(const ParameterLayout& layout, const ScheduleOptions& options) {
  size_t largest = 0;
  for (size_t index = 0; index < layout.spans().size(); ++index)
    if (StagedTier::staged(options, index))
      largest = std::max(largest, layout.spans()[index].count);
  return largest;
}

size_t moment_floats(OptimizerStateKind kind, size_t count) {
  return optimizer_moments_padded_bytes(kind, count) / sizeof(float);
}

// Whether a staged block of `options` is streamed (WeightRing::streamed_spans): its weights live
// in the host's copy the ring fills from, which its update writes.
bool any_staged_streamed(const ParameterLayout& layout, const ScheduleOptions& options) {
  if (options.streamed_blocks == 0) return false;
  const std::vector<char> streamed =
      WeightRing::streamed_spans(layout, options.update_sites, options.streamed_blocks);
  for (size_t index = 0; index < streamed.size(); ++index)
    if (streamed[index] && StagedTier::staged(options, index)) return true;
  return false;
}

// Whether the streamed staged blocks' new weights go to the host in bf16, written by the device's
// AdamW into the slot (else the fp32 master weights are the streamed copy's).
bool bf16_weights_in_slot(const ParameterLayout& layout, const ScheduleOptions& options) {
  return any_staged_streamed(layout, options) && WeightRing::element_bytes(options) == 2;
}

}  // namespace

bool StagedTier::staged(const ScheduleOptions& options, size_t index) {
  return index < options.update_sites.size() && options.update_sites[index] == UpdateSite::kStaged;
}

bool StagedTier::any(const ScheduleOptions& options) {
  return std::find(options.update_sites.begin(), options.update_sites.end(), UpdateSite::kStaged) !=
         options.update_sites.end();
}

bool StagedTier::params_in_slot(const ParameterLayout& layout, const ScheduleOptions& options) {
  return options.weights_in_place || options.weights_land_in_compute_copy ||
         any_staged_streamed(layout, options);
}

size_t StagedTier::slot_elements(const ParameterLayout& layout, const ScheduleOptions& options) {
  const size_t part =
      options.staging_part_elements > 0 ? options.staging_part_elements : kStagingPartElements;
  return std::min(largest_staged_span(layout, options), part);
}

BufferList StagedTier::buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                               DeviceKinds kinds) {
  if (!any(options)) return {};
  const size_t largest = slot_elements(layout, options);
  const size_t slots = static_cast<size_t>(std::max(1, options.staging_slots));
  const std::string of = std::to_string(slots) + " staging slot" + (slots > 1 ? "s" : "") +
                         " of the staged blocks (their AdamW on the device)";
  BufferList list;
  list.push_back({MemorySide::kDevice, TensorClass::kWeightGrads, kinds.own,
                  slots * slot_stride(largest) * sizeof(float), "gradients: " + of});
  if (params_in_slot(layout, options))
    list.push_back({MemorySide::kDevice, TensorClass::kMasterWeights, kinds.own,
                    slots * slot_stride(largest) * sizeof(float), "fp32 master weights: " + of});
  list.push_back(
      {MemorySide::kDevice, TensorClass::kOptimizerMoments, kinds.own,
       slots * slot_stride(moment_floats(options.optimizer_state, largest)) * sizeof(float),
       "AdamW m and v, " + name_of(options.optimizer_state) + ": " + of});
  if (bf16_weights_in_slot(layout, options))
    list.push_back({MemorySide::kDevice, TensorClass::kWeights, kinds.own,
                    slots * slot_stride((largest + 1) / 2) * sizeof(float),
                    "bf16 weights of the streamed staged blocks, on their way to the host: " + of});
  return list;
}

StagedTier::StagedTier(Device& device, const ParameterLayout& layout,
                       const ScheduleOptions& options)
    : device_(device),
      layout_(layout),
      kind_(options.optimizer_state),
      staged_(layout.spans().size(), 0),
      in_flight_(layout.spans().size(), 0) {
  for (size_t index = 0; index < staged_.size(); ++index) {
    staged_[index] = staged(options, index) ? 1 : 0;
    const bool head = index == 0 || index + 1 == staged_.size();
    LAYUP_CHECK(!staged_[index] || !head,
                "only blocks can be staged through the device (--optimizer-placement staged:S), "
                "not the embeddings or the final norm");
  }
  LAYUP_CHECK(options.staging_slots >= 1, "the staged blocks need at least one staging slot (got ",
              options.staging_slots, ")");
  // A part starts where an 8-bit block of the moments starts (AdamWMoments::at).
  LAYUP_CHECK(options.staging_part_elements % kOptimizerStateBlock == 0,
              "internal error: a staging slot's part of ", options.staging_part_elements,
              " elements is not a multiple of ", kOptimizerStateBlock);
  const BufferList listed = buffers(layout, options, device.kinds());
  slot_elements_ = slot_elements(layout, options);
  const size_t grad_stride = slot_stride(slot_elements_);
  const size_t moment_stride = slot_stride(moment_floats(kind_, slot_elements_));
  const size_t weights_stride = slot_stride((slot_elements_ + 1) / 2);
  const bool params_in = params_in_slot(layout, options);
  const bool weights_in = bf16_weights_in_slot(layout, options);
  size_t next = 0;  // the buffers in buffers()'s order
  grads_ = device.allocate(listed.at(next++));
  if (params_in) params_ = device.allocate(listed.at(next++));
  moments_ = device.allocate(listed.at(next++));
  if (weights_in) weights_ = device.allocate(listed.at(next++));
  slots_.resize(static_cast<size_t>(options.staging_slots));
  for (size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].grads = grads_.data() + s * grad_stride;
    slots_[s].params = params_in ? params_.data() + s * grad_stride : nullptr;
    slots_[s].moments = moments_.data() + s * moment_stride;
    slots_[s].weights = weights_in ? weights_.data() + s * weights_stride : nullptr;
  }
}

StagedTier::~StagedTier() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return copies_in_flight_ == 0; });
}

size_t StagedTier::take_slot(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    // Round robin from the slot after the last one taken: the slot taken longest ago is the one
    // most likely free.
    for (size_t k = 0; k < slots_.size(); ++k) {
      const size_t s = (next_slot_ + k) % slots_.size();
      if (slots_[s].busy) continue;
      slots_[s].busy = true;
      next_slot_ = (s + 1) % slots_.size();
      return s;
    }
    changed_.wait(lock);
  }
}

void StagedTier::update(const Update& u, const AdamWStep& adamw, std::function<void()> landed) {
  LAYUP_CHECK(holds(u.index), "internal error: span ", u.index, " is not staged");
  {
    std::unique_lock lock(mutex_);
    // The span's last update first: its copies back read the device's copy this one overwrites,
    // and write the state this one reads.
    changed_.wait(lock, [&] { return in_flight_[u.index] == 0; });
  }
  const size_t count = layout_.spans()[u.index].count;
  // The span has landed once every part has.
  auto parts_left =
      std::make_shared<std::atomic<size_t>>((count + slot_elements_ - 1) / slot_elements_);
  auto span_landed = std::make_shared<std::function<void()>>(std::move(landed));
  for (size_t first = 0; first < count; first += slot_elements_)
    update_part(u, first, std::min(slot_elements_, count - first), adamw,
                [parts_left, span_landed] {
                  if (parts_left->fetch_sub(1) == 1) (*span_landed)();
                });
}

void StagedTier::update_part(const Update& u, size_t first, size_t count, const AdamWStep& adamw,
                             std::function<void()> landed) {
  const Span& span = layout_.spans()[u.index];
  size_t s = 0;
  {
    std::unique_lock lock(mutex_);
    s = take_slot(lock);
    in_flight_[u.index] += 1;
    copies_in_flight_ += 1;
  }
  const auto release = [this, s, index = u.index] {
    std::lock_guard lock(mutex_);
    slots_[s].busy = false;
    in_flight_[index] -= 1;
    copies_in_flight_ -= 1;
    changed_.notify_all();
  };
  const Slot& slot = slots_[s];
  float* params = u.device_params != nullptr ? u.device_params + first : slot.params;
  // The host's moments from the part's first element (a block boundary of 8-bit state), the
  // slot's laid out for the part alone.
  const AdamWMoments host_from =
      AdamWMoments::in_buffer(kind_, const_cast<float*>(u.from_moments), span.count).at(first);
  const AdamWMoments host_to = AdamWMoments::in_buffer(kind_, u.to_moments, span.count).at(first);
  const AdamWMoments in_slot = AdamWMoments::in_buffer(kind_, slot.moments, count);
  const auto from_arrays = moment_arrays(host_from, count);
  const auto to_arrays = moment_arrays(host_to, count);
  const auto slot_arrays = moment_arrays(in_slot, count);
  const size_t bytes = count * sizeof(float);
  bool copying_back = false;
  try {
    LAYUP_CHECK(params != nullptr, "internal error: staged span ", u.index,
                " has neither a device copy nor master weights in its slot");
    device_.copy_to_device_after(nullptr, slot.grads, u.grads + first, bytes);
    std::shared_ptr<const DeviceFence> in =
        device_.copy_to_device_after(nullptr, params, u.from_params + first, bytes);
    for (size_t a = 0; a < slot_arrays.size(); ++a)
      in = device_.copy_to_device_after(nullptr, slot_arrays[a].data, from_arrays[a].data,
                                        slot_arrays[a].bytes);
    // Waited for here rather than on the device: the compute stream would otherwise stall the
    // device thread's work behind this copy.
    device_.wait_for(*in);
    const bool weights_out = u.stream_copy != nullptr && u.stream_element_bytes == 2;
    LAYUP_CHECK(!weights_out || slot.weights != nullptr, "internal error: staged span ", u.index,
                " is streamed in bf16 and its slot has no room for its weights");
    void* bf16 = u.bf16_weights != nullptr ? static_cast<uint16_t*>(u.bf16_weights) + first
                 : weights_out             ? slot.weights
                                           : nullptr;
    device_.adamw_update_span_part_state(layout_, span, first, count, params, slot.grads, in_slot,
                                         adamw, bf16);
    const std::shared_ptr<const DeviceFence> updated = device_.fence();
    copying_back = true;
    device_.copy_to_host_async(*updated, u.to_params + first, params, bytes, {});
    if (u.stream_copy != nullptr)
      device_.copy_to_host_async(*updated,
                                 static_cast<char*>(u.stream_copy) + first * u.stream_element_bytes,
                                 weights_out ? slot.weights : static_cast<const void*>(params),
                                 count * u.stream_element_bytes, {});
    // On one stream the copies land in order: the last one's handler frees the slot.
    for (size_t a = 0; a + 1 < slot_arrays.size(); ++a)
      device_.copy_to_host_async(*updated, to_arrays[a].data, slot_arrays[a].data,
                                 slot_arrays[a].bytes, {});
    device_.copy_to_host_async(*updated, to_arrays.back().data, slot_arrays.back().data,
                               slot_arrays.back().bytes, [release, landed = std::move(landed)] {
                                 release();
                                 landed();
                               });
  } catch (...) {
    // A copy back that started may still read the slot: wait for the device before freeing it.
    if (copying_back) device_.wait_for(*device_.fence());
    release();
    throw;
  }
}

void StagedTier::wait_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return copies_in_flight_ == 0; });
}

}  // namespace layup
