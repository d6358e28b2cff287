// GrowableWorkspace; see growable_workspace.h.
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/growable_workspace.h"

namespace layup::cuda {

GrowableWorkspace::GrowableWorkspace(std::function<void(size_t bytes)> resized)
    : resized_(std::move(resized)) {}

GrowableWorkspace::~GrowableWorkspace() {
  cudaFree(data_);  // destructors cannot throw: the status is ignored
}

void* GrowableWorkspace::reserve(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_) return data_;
  LAYUP_CUDA_CHECK(cudaStreamSynchronize(stream));
  LAYUP_CUDA_CHECK(cudaFree(data_));
  data_ = nullptr;
  bytes_ = 0;
  if (resized_) resized_(0);
  LAYUP_CUDA_CHECK(cudaMalloc(&data_, bytes));
  bytes_ = bytes;
  if (resized_) resized_(bytes_);
  return data_;
}

}  // namespace layup::cuda
