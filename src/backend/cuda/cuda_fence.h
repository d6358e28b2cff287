// The CUDA device's fence (backend/device.h's DeviceFence): an event recorded on a stream. Shared
// by the device and the collectives, whose stream waits for the device's fences and records its
// own. Needs the CUDA runtime's headers: for the CUDA sources only.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"
#include "backend/device.h"

namespace layup {

// Recorded on the legacy default stream (the default), it passes once all work issued before it
// on the blocking streams (the backend's included) is done; on a copy or communication stream,
// once that stream's work issued before it is.
class CudaFence final : public DeviceFence {
 public:
  explicit CudaFence(cudaStream_t stream = cudaStreamLegacy) {
    LAYUP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    LAYUP_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~CudaFence() override { cudaEventDestroy(event_); }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace layup
