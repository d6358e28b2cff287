// What a device's memory system allows, as the placement plan needs it: whether the GPU shares
// DRAM with the CPU (integrated), can touch pageable host memory, and whether the CPU may touch
// managed memory while kernels run (docs/memory.md, "What each memory kind means on each device").
#pragma once

#include <cstddef>
#include <string>

#include "core/run_choices.h"

namespace layup {

struct DeviceMemoryAttributes {
  DeviceKind device = DeviceKind::kCpu;  // resolved: cpu or cuda
  std::string name = "cpu";              // the GPU's name on cuda
  std::string pci_bus_id;  // the GPU's, as CUDA names it ("0000:19:00.0"; NVML finds it so)
  // False when the values were not read from a GPU (a build without CUDA, or no GPU here): then
  // they are those of a discrete GPU over PCIe, as our H200 reports them.
  bool queried = true;
  bool integrated = false;                      // cudaDevAttrIntegrated
  bool pageable_memory_access = false;          // cudaDevAttrPageableMemoryAccess
  bool pageable_uses_host_page_tables = false;  // ...UsesHostPageTables
  bool concurrent_managed_access = false;       // cudaDevAttrConcurrentManagedAccess
  bool managed_memory = false;                  // cudaDevAttrManagedMemory
  bool can_map_host_memory = false;             // cudaDevAttrCanMapHostMemory
  // cudaMemGetInfo when the attributes were read (0 otherwise): what the GPU has free now, with
  // every other process's use taken out.
  size_t free_bytes = 0;
  size_t total_bytes = 0;

  // One line for reports: "cuda (NVIDIA H200): integrated 0, pageable access 0, ...".
  std::string describe() const;
};

// The CPU backend: host memory only.
DeviceMemoryAttributes cpu_memory_attributes();

// A discrete GPU over PCIe, as our H200 reports itself, with queried = false: what a plan for
// cuda assumes where no GPU can be asked (the CUDA backend reads the real ones:
// read_cuda_memory_attributes in backend/cuda/cuda_device.h).
DeviceMemoryAttributes assumed_cuda_memory_attributes();

}  // namespace layup
