// DeviceBuffer: ownership of device memory, whatever the device.
#include "backend/device.h"

namespace layup {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ && data_) device_->release(data_);
    device_ = other.device_;
    data_ = other.data_;
    count_ = other.count_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.count_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (device_ && data_) device_->release(data_);
}

}  // namespace layup
