// DeviceBuffer: ownership of device memory, whatever the device.
#include "backend/device.h"

#include "core/error.h"

namespace layup {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ && data_) device_->release(data_, kind_);
    device_ = other.device_;
    data_ = other.data_;
    count_ = other.count_;
    record_ = std::move(other.record_);
    kind_ = other.kind_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device_ && data_) device_->release(data_, kind_);
}

Device::Device(std::shared_ptr<MemoryAccountant> accountant)
    : accountant_(accountant ? std::move(accountant) : std::make_shared<MemoryAccountant>()) {}

std::shared_ptr<const DeviceFence> Device::copy_to_device_after(const DeviceFence* after,
                                                                void* device_dst,
                                                                const void* host_src,
                                                                size_t bytes) {
  LAYUP_CHECK(bytes % sizeof(float) == 0, "internal error: ", name(),
              " copies whole floats to the device, not ", bytes, " bytes");
  if (after != nullptr) wait_for(*after);
  copy_to_device(static_cast<float*>(device_dst), static_cast<const float*>(host_src),
                 bytes / sizeof(float));
  return fence();  // the copy has landed when copy_to_device returns
}

void Device::copy_to_host_async(const DeviceFence& after, void* host_dst, const void* device_src,
                                size_t bytes, std::function<void()> landed) {
  LAYUP_CHECK(bytes % sizeof(float) == 0, "internal error: ", name(),
              " copies whole floats to the host, not ", bytes, " bytes");
  wait_for(after);
  copy_to_host(static_cast<float*>(host_dst), static_cast<const float*>(device_src),
               bytes / sizeof(float));
  if (landed) landed();
}

std::shared_ptr<const DeviceFence> DeviceCollectives::start_sum_in_rank_order(
    Device& device, const DeviceFence& after, float* data, size_t count) {
  device.wait_for(after);
  sum_in_rank_order(data, count);
  return device.fence();
}

std::vector<uint8_t> Device::new_collectives_id() {
  fail("the ", name(), " device has no collectives of its own (several ranks sum in host memory)");
}

std::unique_ptr<DeviceCollectives> Device::join_collectives(const std::vector<uint8_t>&, int, int) {
  fail("the ", name(), " device has no collectives of its own (several ranks sum in host memory)");
}

void Device::adamw_update_span_part(const ParameterLayout&, const Span&, size_t, size_t, float*,
                                    const float*, float*, float*, const AdamWStep&) {
  fail("the ", name(),
       " device cannot update part of a span, which ZeRO-1 (the optimizer state sharded "
       "across ranks) needs");
}

void Device::adamw_update_span_state(const ParameterLayout& layout, const Span& span, float* params,
                                     const float* grads, const AdamWMoments& moments,
                                     const AdamWStep& step, void* bf16_weights) {
  LAYUP_CHECK(moments.kind == OptimizerStateKind::kFp32, "the ", name(), " device keeps no ",
              name_of(moments.kind), " optimizer state; use --optimizer-state fp32");
  adamw_update_span(layout, span, params, grads, moments.m_fp32(), moments.v_fp32(), step,
                    bf16_weights);
}

void Device::adamw_update_span_part_state(const ParameterLayout& layout, const Span& span,
                                          size_t first, size_t count, float* params,
                                          const float* grads, const AdamWMoments& moments,
                                          const AdamWStep& step, void* bf16_weights) {
  LAYUP_CHECK(moments.kind == OptimizerStateKind::kFp32, "the ", name(), " device keeps no ",
              name_of(moments.kind), " optimizer state; use --optimizer-state fp32");
  LAYUP_CHECK(bf16_weights == nullptr, "the ", name(),
              " device writes no bf16 copy of part of a span");
  adamw_update_span_part(layout, span, first, count, params, grads, moments.m_fp32(),
                         moments.v_fp32(), step);
}

MemoryRecord Device::record(size_t count, TensorClass tensor_class, MemorySide side,
                            MemoryKind kind) const {
  return MemoryRecord(accountant_, side, tensor_class, kind, count * sizeof(float));
}

}  // namespace layup
