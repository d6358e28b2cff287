// StagedTier: the device's AdamW on blocks whose state the host keeps (staged_tier.h).
#include "schedule/staged_tier.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"

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

}  // namespace

bool StagedTier::staged(const ScheduleOptions& options, size_t index) {
  return index < options.update_sites.size() && options.update_sites[index] == UpdateSite::kStaged;
}

bool StagedTier::any(const ScheduleOptions& options) {
  return std::find(options.update_sites.begin(), options.update_sites.end(), UpdateSite::kStaged) !=
         options.update_sites.end();
}

bool StagedTier::params_in_slot(const ScheduleOptions& options) {
  return options.weights_in_place || options.weights_land_in_compute_copy;
}

BufferList StagedTier::buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                               DeviceKinds kinds) {
  if (!any(options)) return {};
  const size_t largest = largest_staged_span(layout, options);
  const size_t slots = static_cast<size_t>(std::max(1, options.staging_slots));
  const std::string of = std::to_string(slots) + " staging slot" + (slots > 1 ? "s" : "") +
                         " of the staged blocks (their AdamW on the device)";
  BufferList list;
  list.push_back({MemorySide::kDevice, TensorClass::kWeightGrads, kinds.own,
                  slots * slot_stride(largest) * sizeof(float), "gradients: " + of});
  if (params_in_slot(options))
    list.push_back({MemorySide::kDevice, TensorClass::kMasterWeights, kinds.own,
                    slots * slot_stride(largest) * sizeof(float), "fp32 master weights: " + of});
  list.push_back(
      {MemorySide::kDevice, TensorClass::kOptimizerMoments, kinds.own,
       slots * slot_stride(moment_floats(options.optimizer_state, largest)) * sizeof(float),
       "AdamW m and v, " + name_of(options.optimizer_state) + ": " + of});
  return list;
}

StagedTier::StagedTier(Device& device, const ParameterLayout& layout,
                       const ScheduleOptions& options, bool params_in_slot)
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
  const BufferList listed = buffers(layout, options, device.kinds());
  const size_t largest = largest_staged_span(layout, options);
  const size_t grad_stride = slot_stride(largest);
  const size_t moment_stride = slot_stride(moment_floats(kind_, largest));
  grads_ = device.allocate(listed.at(0));
  if (params_in_slot) params_ = device.allocate(listed.at(1));
  moments_ = device.allocate(listed.back());
  slots_.resize(static_cast<size_t>(options.staging_slots));
  for (size_t s = 0; s < slots_.size(); ++s) {
    slots_[s].grads = grads_.data() + s * grad_stride;
    slots_[s].params = params_in_slot ? params_.data() + s * grad_stride : nullptr;
    slots_[s].moments = moments_.data() + s * moment_stride;
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
  const Span& span = layout_.spans()[u.index];
  const size_t count = span.count;
  const size_t moments_bytes = optimizer_moments_padded_bytes(kind_, count);
  size_t s = 0;
  {
    std::unique_lock lock(mutex_);
    // The span's last update first: its copies back read the device's copy this one overwrites,
    // and write the state this one reads.
    changed_.wait(lock, [&] { return in_flight_[u.index] == 0; });
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
  float* params = u.device_params != nullptr ? u.device_params : slot.params;
  bool copying_back = false;
  try {
    LAYUP_CHECK(params != nullptr, "internal error: staged span ", u.index,
                " has neither a device copy nor master weights in its slot");
    device_.copy_to_device_after(nullptr, slot.grads, u.grads, count * sizeof(float));
    device_.copy_to_device_after(nullptr, params, u.from_params, count * sizeof(float));
    const std::shared_ptr<const DeviceFence> in =
        device_.copy_to_device_after(nullptr, slot.moments, u.from_moments, moments_bytes);
    // Waited for here rather than on the device: the compute stream would otherwise stall the
    // device thread's work behind this copy.
    device_.wait_for(*in);
    device_.adamw_update_span_state(layout_, span, params, slot.grads,
                                    AdamWMoments::in_buffer(kind_, slot.moments, count), adamw,
                                    u.bf16_weights);
    const std::shared_ptr<const DeviceFence> updated = device_.fence();
    copying_back = true;
    device_.copy_to_host_async(*updated, u.to_params, params, count * sizeof(float), {});
    device_.copy_to_host_async(*updated, u.to_moments, slot.moments, moments_bytes,
                               [release, landed = std::move(landed)] {
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
