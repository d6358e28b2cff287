// A device workspace whose size a library decides at run time (cuDNN's attention asks for its
// bytes when it builds a graph). The backend owns it and learns every new size through a callback,
// so it records the bytes itself: the op that grows it never sees the memory accountant.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace layup::cuda {

class GrowableWorkspace {
 public:
  // `resized(bytes)` runs after every change of the allocation: 0 when the old one is freed, then
  // the new size.
  explicit GrowableWorkspace(std::function<void(size_t bytes)> resized = {});
  ~GrowableWorkspace();
  GrowableWorkspace(const GrowableWorkspace&) = delete;
  GrowableWorkspace& operator=(const GrowableWorkspace&) = delete;

  // At least `bytes` of device memory. Growing first waits for `stream`, whose work may still use
  // the old allocation, and does not keep the contents.
  void* reserve(size_t bytes, cudaStream_t stream);
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  std::function<void(size_t)> resized_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace layup::cuda
