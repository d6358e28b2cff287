// cuda_allocate and cuda_free; see cuda_memory.h.
#include <cuda_runtime.h>

#include <cstdio>
#include <new>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_memory.h"
#include "core/error.h"
#include "memory/parallel_pages.h"

namespace layup {

void* cuda_allocate(size_t bytes, MemoryKind kind, const std::string& what) {
  if (bytes == 0) return nullptr;
  void* data = nullptr;
  switch (kind) {
    case MemoryKind::kDevice: {
      const cudaError_t status = cudaMalloc(&data, bytes);
      if (status != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky; clear it
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fail("out of GPU memory allocating ", bytes / 1e9, " GB for the ", what, " (",
             free_bytes / 1e9, " GB free of ", total_bytes / 1e9, "): ", cudaGetErrorString(status),
             "; try a smaller --batch or --seq-len");
      }
      LAYUP_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, cudaStreamLegacy));
      return data;
    }
    case MemoryKind::kPinnedMapped: {
      // Mapped as well as pinned: with unified addressing the GPU reads and writes it in place.
      const cudaError_t status =
          cudaHostAlloc(&data, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
      if (status != cudaSuccess) {
        cudaGetLastError();
        fail("cannot pin ", bytes / 1e9, " GB of host memory for the ", what, ": ",
             cudaGetErrorString(status),
             "; the host may be short of memory (or of locked-memory allowance: ulimit -l)");
      }
      zero_in_parallel(data, bytes);
      return data;
    }
    case MemoryKind::kManaged: {
      size_t free_bytes = 0, total_bytes = 0;
      LAYUP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      LAYUP_CHECK(bytes <= free_bytes, "managed memory for the ", what, " needs ", bytes / 1e9,
                  " GB but the GPU has ", free_bytes / 1e9,
                  " GB free; place it elsewhere (--place ... =device or pinned) or shrink the run");
      const cudaError_t status = cudaMallocManaged(&data, bytes, cudaMemAttachGlobal);
      if (status != cudaSuccess) {
        cudaGetLastError();
        fail("cannot allocate ", bytes / 1e9, " GB of managed memory for the ", what, ": ",
             cudaGetErrorString(status));
      }
      LAYUP_CUDA_CHECK(cudaMemset(data, 0, bytes));
      return data;
    }
    case MemoryKind::kPageable:
    case MemoryKind::kHost:
      data = ::operator new[](bytes, std::align_val_t(64));
      zero_in_parallel(data, bytes);
      return data;
  }
  fail("unknown memory kind for the ", what);
}

void cuda_free(void* data, MemoryKind kind) noexcept {
  if (data == nullptr) return;
  cudaError_t status = cudaSuccess;
  switch (kind) {
    case MemoryKind::kDevice:
    case MemoryKind::kManaged:
      status = cudaFree(data);
      break;
    case MemoryKind::kPinnedMapped:
      status = cudaFreeHost(data);
      break;
    case MemoryKind::kPageable:
    case MemoryKind::kHost:
      ::operator delete[](data, std::align_val_t(64));
      break;
  }
  if (status != cudaSuccess)
    std::fprintf(stderr, "layup: freeing %s memory failed: %s\n", memory_kind_name(kind),
                 cudaGetErrorString(status));
}

}  // namespace layup
