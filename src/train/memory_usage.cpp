// Process-wide memory readings: cudaMemGetInfo on the GPU, getrusage on the host.
#include "train/memory_usage.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#ifdef LAYUP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace layup {

long long device_memory_used_bytes() {
#ifdef LAYUP_HAVE_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    return static_cast<long long>(total_bytes - free_bytes);
  cudaGetLastError();  // no GPU: clear the error so later CUDA calls do not see it
#endif
  return -1;
}

long long process_peak_rss_bytes() {
  // VmHWM is this program's own peak. getrusage's ru_maxrss survives exec, so it would report the
  // parent's peak when that was larger (a Python test harness with PyTorch loaded, say).
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // in kB
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<long long>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace layup
