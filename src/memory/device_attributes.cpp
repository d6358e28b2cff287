// Device memory attributes: read from the CUDA driver where there is one.
#include "memory/device_attributes.h"

#include "core/error.h"

#ifdef LAYUP_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_device.h"
#endif

namespace layup {

std::string DeviceMemoryAttributes::describe() const {
  if (device == DeviceKind::kCpu) return "cpu: host memory only";
  auto flag = [](bool value) { return value ? "1" : "0"; };
  return name_of(device) + " (" + name + "): integrated " + flag(integrated) +
         ", pageable memory access " + flag(pageable_memory_access) + " (host page tables " +
         flag(pageable_uses_host_page_tables) + "), concurrent managed access " +
         flag(concurrent_managed_access) + ", managed memory " + flag(managed_memory) +
         ", maps host memory " + flag(can_map_host_memory) +
         (queried ? "" : " [assumed: no GPU was queried]");
}

DeviceMemoryAttributes cpu_memory_attributes() {
  return DeviceMemoryAttributes{};
}

DeviceMemoryAttributes cuda_memory_attributes() {
  DeviceMemoryAttributes attributes;
  attributes.device = DeviceKind::kCuda;
  // A discrete GPU over PCIe, as our H200 reports itself (shared/DESIGN.md).
  attributes.name = "discrete GPU";
  attributes.queried = false;
  attributes.concurrent_managed_access = true;
  attributes.managed_memory = true;
  attributes.can_map_host_memory = true;
#ifdef LAYUP_HAVE_CUDA
  if (!cuda_device_available(nullptr)) return attributes;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return attributes;
  }
  auto read = [device](cudaDeviceAttr attribute) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return value != 0;
  };
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device) == cudaSuccess)
    attributes.name = properties.name;
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) == cudaSuccess)
    attributes.pci_bus_id = bus_id;
  else
    cudaGetLastError();
  attributes.queried = true;
  attributes.integrated = read(cudaDevAttrIntegrated);
  attributes.pageable_memory_access = read(cudaDevAttrPageableMemoryAccess);
  attributes.pageable_uses_host_page_tables =
      read(cudaDevAttrPageableMemoryAccessUsesHostPageTables);
  attributes.concurrent_managed_access = read(cudaDevAttrConcurrentManagedAccess);
  attributes.managed_memory = read(cudaDevAttrManagedMemory);
  attributes.can_map_host_memory = read(cudaDevAttrCanMapHostMemory);
  if (cudaMemGetInfo(&attributes.free_bytes, &attributes.total_bytes) != cudaSuccess) {
    cudaGetLastError();
    attributes.free_bytes = attributes.total_bytes = 0;
  }
#endif
  return attributes;
}

DeviceMemoryAttributes memory_attributes_of(DeviceKind device) {
  LAYUP_CHECK(device != DeviceKind::kAuto, "memory attributes need a resolved device, cpu or cuda");
  return device == DeviceKind::kCuda ? cuda_memory_attributes() : cpu_memory_attributes();
}

}  // namespace layup
