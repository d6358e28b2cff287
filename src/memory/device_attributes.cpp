// Device memory attributes: the CPU backend's, and a discrete GPU's as assumed without one.
#include "memory/device_attributes.h"

#include "core/error.h"

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

DeviceMemoryAttributes assumed_cuda_memory_attributes() {
  DeviceMemoryAttributes attributes;
  attributes.device = DeviceKind::kCuda;
  // A discrete GPU over PCIe, as an H200 reports itself (docs/memory.md).
  attributes.name = "discrete GPU";
  attributes.queried = false;
  attributes.concurrent_managed_access = true;
  attributes.managed_memory = true;
  attributes.can_map_host_memory = true;
  return attributes;
}

}  // namespace layup
