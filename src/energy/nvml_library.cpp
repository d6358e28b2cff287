// NVML through dlopen; see nvml_library.h.
#include "energy/nvml_library.h"

#include <dlfcn.h>

namespace layup::nvml {

namespace {

template <class Function>
bool load(void* library, Function& function, const char* symbol) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  return function != nullptr;
}

}  // namespace

Library::Library() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* why = dlerror();
    reason_ = std::string("NVML is not available (") + (why != nullptr ? why : "dlopen failed") +
              "): the NVIDIA driver's libnvidia-ml.so.1 is needed to read the GPU's energy and "
              "clocks";
    return;
  }
  const bool complete = load(library_, init, "nvmlInit_v2") &&
                        load(library_, shutdown, "nvmlShutdown") &&
                        load(library_, error_string, "nvmlErrorString") &&
                        load(library_, by_index, "nvmlDeviceGetHandleByIndex_v2") &&
                        load(library_, by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                        load(library_, name, "nvmlDeviceGetName") &&
                        load(library_, total_energy, "nvmlDeviceGetTotalEnergyConsumption") &&
                        load(library_, power, "nvmlDeviceGetPowerUsage") &&
                        load(library_, power_limit, "nvmlDeviceGetEnforcedPowerLimit");
  if (!complete) {
    reason_ = "this NVML lacks an entry point layup needs (an old driver?)";
    return;
  }
  load(library_, clock, "nvmlDeviceGetClockInfo");
  load(library_, max_clock, "nvmlDeviceGetMaxClockInfo");
  // The reasons' entry point was renamed in CUDA 12.x's NVML; older drivers have the old name.
  if (!load(library_, clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons"))
    load(library_, clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
  const Return status = init();
  if (status != kSuccess) {
    reason_ = "NVML did not initialize: " + error(status);
    return;
  }
  initialized_ = true;
}

Library::~Library() {
  if (initialized_) shutdown();
  if (library_ != nullptr) dlclose(library_);
}

std::string Library::error(Return status) const {
  const char* text = error_string != nullptr ? error_string(status) : nullptr;
  return text != nullptr ? text : "NVML error " + std::to_string(status);
}

Device Library::find(const std::string& pci_bus_id, std::string& why) const {
  Device device = nullptr;
  const Return found =
      pci_bus_id.empty() ? by_index(0, &device) : by_pci_bus_id(pci_bus_id.c_str(), &device);
  if (found == kSuccess) return device;
  why = "NVML cannot find the GPU " + (pci_bus_id.empty() ? "0" : pci_bus_id) + ": " + error(found);
  return nullptr;
}

}  // namespace layup::nvml
