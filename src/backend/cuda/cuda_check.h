// Checks for every CUDA runtime and cuBLAS(Lt) call: a failure becomes a layup::Error that names
// the call as written, the library's own description of the error, and where it happened.
//
// Kernel launches return nothing; follow each with LAYUP_CUDA_CHECK_LAUNCH() so that a bad launch
// configuration is reported at the launch and not at some later, unrelated call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/error.h"

namespace layup::cuda {

inline void check_cuda_status(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    fail(call, " failed: ", cudaGetErrorString(status), " (", cudaGetErrorName(status), ") at ",
         file, ":", line);
  }
}

inline void check_cublas_status(cublasStatus_t status, const char* call, const char* file,
                                int line) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail(call, " failed: ", cublasLtGetStatusString(status), " (", cublasLtGetStatusName(status),
         ") at ", file, ":", line);
  }
}

}  // namespace layup::cuda

#define LAYUP_CUDA_CHECK(call) ::layup::cuda::check_cuda_status((call), #call, __FILE__, __LINE__)
#define LAYUP_CUBLAS_CHECK(call) \
  ::layup::cuda::check_cublas_status((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports launch-configuration errors (not faults inside the kernel, which
// surface at the next synchronizing call).
#define LAYUP_CUDA_CHECK_LAUNCH() LAYUP_CUDA_CHECK(cudaGetLastError())
