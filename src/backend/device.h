// The device a backend computes on, as the schedules see it: memory, copies, and the two bulk
// operations of an optimizer step (gradient norm, AdamW), so one schedule serves every backend.
//
// On the CPU backend "device memory" is host memory and the operations run on the host; on the
// CUDA backend they are cudaMalloc'd buffers and kernels. Streams and events for the layer-wise
// overlap join this interface with the offload and layup schedules.
//
// Every allocation names its tensor class and is recorded in the device's MemoryAccountant
// (memory/memory_accountant.h) for as long as its buffer lives, as device-side memory of the
// device's kind (host on the CPU backend, device on CUDA).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "memory/memory_accountant.h"
#include "memory/tensor_class.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"

namespace layup {

class Device;

// Floats in a device's memory, freed by that device when the buffer goes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `record` holds the buffer's bytes in the accountant until the buffer goes.
  DeviceBuffer(Device* device, float* data, size_t count, MemoryRecord record)
      : device_(device), data_(data), count_(count), record_(std::move(record)) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  float* data() const { return data_; }
  size_t count() const { return count_; }

 private:
  Device* device_ = nullptr;
  float* data_ = nullptr;
  size_t count_ = 0;
  MemoryRecord record_;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;

  // A zeroed buffer of `count` floats in device memory, recorded in accountant() as
  // `tensor_class` (device side, of memory_kind()) while it lives.
  virtual DeviceBuffer allocate(size_t count, TensorClass tensor_class) = 0;
  virtual void release(float* data) = 0;

  // The kind of memory allocate() hands out: host on the CPU backend, device on CUDA.
  virtual MemoryKind memory_kind() const = 0;
  // The ledger this device records into; a run shares it with its backend.
  const std::shared_ptr<MemoryAccountant>& accountant() const { return accountant_; }

  virtual void copy_to_device(float* device_dst, const float* host_src, size_t count) = 0;
  virtual void copy_to_host(float* host_dst, const float* device_src, size_t count) = 0;
  virtual void fill_zero(float* device_dst, size_t count) = 0;
  // device_dst[i] += device_src[i]: one float add per element, so the sum of micro-batch
  // gradients rounds the same on every device and in every mode.
  virtual void add(float* device_dst, const float* device_src, size_t count) = 0;

  // Sum of squares of x, bitwise reproducible run to run (see optim/grad_norm.h).
  virtual double sum_of_squares(const float* x, size_t count) = 0;

  // AdamW on one span, weight decay per tensor as the layout says (see optim/adamw.h).
  virtual void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                                 const float* grads, float* m, float* v, const AdamWStep& step) = 0;

 protected:
  // A null accountant gives the device a ledger of its own.
  explicit Device(std::shared_ptr<MemoryAccountant> accountant);
  // What allocate() hands its DeviceBuffer: `count` floats of `tensor_class` in the ledger.
  MemoryRecord record(size_t count, TensorClass tensor_class) const;

 private:
  std::shared_ptr<MemoryAccountant> accountant_;
};

// The CPU backend's device; it records into `accountant` (null: a ledger of its own).
std::unique_ptr<Device> make_cpu_device(std::shared_ptr<MemoryAccountant> accountant = nullptr);

}  // namespace layup
