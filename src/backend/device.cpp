// DeviceBuffer: ownership of device memory, whatever the device.
#include "backend/device.h"

namespace layup {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ && data_) device_->release(data_, side_);
    device_ = other.device_;
    data_ = other.data_;
    count_ = other.count_;
    record_ = std::move(other.record_);
    side_ = other.side_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device_ && data_) device_->release(data_, side_);
}

Device::Device(std::shared_ptr<MemoryAccountant> accountant)
    : accountant_(accountant ? std::move(accountant) : std::make_shared<MemoryAccountant>()) {}

MemoryRecord Device::record(size_t count, TensorClass tensor_class) const {
  return MemoryRecord(accountant_, MemorySide::kDevice, tensor_class, memory_kind(),
                      count * sizeof(float));
}

MemoryRecord Device::record_host(size_t count, TensorClass tensor_class) const {
  return MemoryRecord(accountant_, MemorySide::kHost, tensor_class, host_memory_kind(),
                      count * sizeof(float));
}

}  // namespace layup
