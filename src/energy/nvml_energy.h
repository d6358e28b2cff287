// The GPU's energy through NVML, the driver's management library, loaded when first needed
// (dlopen of libnvidia-ml.so.1) so that layup runs, and builds, where there is no NVIDIA driver.
// The source reads the GPU's total-energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since
// the driver loaded; Volta and newer); on a GPU without it, its power draw
// (nvmlDeviceGetPowerUsage), which the meter samples and integrates, and says so in its method.
#pragma once

#include <memory>
#include <string>

#include "energy/energy_meter.h"

namespace layup {

// The GPU with this PCI bus id ("0000:19:00.0", as cudaDeviceGetPCIBusId gives it; empty: NVML's
// device 0). Unavailable, with the reason, where NVML or the GPU cannot be reached.
std::unique_ptr<EnergySource> make_nvml_gpu_source(const std::string& pci_bus_id);

}  // namespace layup
