// NVML through dlopen; see nvml_energy.h. Only the few entry points used here are declared, with
// the signatures of NVML's documented C API (nvml.h is not needed to build).
#include "energy/nvml_energy.h"

#include <dlfcn.h>

#include <optional>
#include <string>

namespace layup {

namespace {

using NvmlReturn = int;  // nvmlReturn_t: NVML_SUCCESS is 0
constexpr NvmlReturn kNvmlSuccess = 0;
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;  // nvmlDevice_t

// The library and the entry points used here; each source holds one initialization of NVML.
class Nvml {
 public:
  Nvml() {
    library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library_ == nullptr) {
      const char* why = dlerror();
      reason_ = std::string("NVML is not available (") + (why != nullptr ? why : "dlopen failed") +
                "): the NVIDIA driver's libnvidia-ml.so.1 is needed to read the GPU's energy";
      return;
    }
    bool complete = load(init_, "nvmlInit_v2") && load(shutdown_, "nvmlShutdown") &&
                    load(error_string_, "nvmlErrorString") &&
                    load(by_index_, "nvmlDeviceGetHandleByIndex_v2") &&
                    load(by_pci_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2") &&
                    load(name_, "nvmlDeviceGetName") &&
                    load(total_energy_, "nvmlDeviceGetTotalEnergyConsumption") &&
                    load(power_, "nvmlDeviceGetPowerUsage") &&
                    load(power_limit_, "nvmlDeviceGetEnforcedPowerLimit");
    if (!complete) {
      reason_ = "this NVML lacks an entry point layup needs (an old driver?)";
      return;
    }
    const NvmlReturn status = init_();
    if (status != kNvmlSuccess) {
      reason_ = "NVML did not initialize: " + error(status);
      return;
    }
    initialized_ = true;
  }
  ~Nvml() {
    if (initialized_) shutdown_();
    if (library_ != nullptr) dlclose(library_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const std::string& reason() const { return reason_; }
  std::string error(NvmlReturn status) const {
    const char* text = error_string_ != nullptr ? error_string_(status) : nullptr;
    return text != nullptr ? text : "NVML error " + std::to_string(status);
  }

  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
  NvmlReturn (*by_index_)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*by_pci_bus_id_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*name_)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*total_energy_)(NvmlDevice, unsigned long long*) = nullptr;  // mJ
  NvmlReturn (*power_)(NvmlDevice, unsigned*) = nullptr;                   // mW
  NvmlReturn (*power_limit_)(NvmlDevice, unsigned*) = nullptr;             // mW

 private:
  template <class Function>
  bool load(Function& function, const char* symbol) {
    function = reinterpret_cast<Function>(dlsym(library_, symbol));
    return function != nullptr;
  }

  void* library_ = nullptr;
  bool initialized_ = false;
  std::string reason_;
};

class NvmlGpuSource final : public EnergySource {
 public:
  explicit NvmlGpuSource(const std::string& pci_bus_id) {
    if (!nvml_.reason().empty()) {
      reason_ = nvml_.reason();
      return;
    }
    const NvmlReturn found = pci_bus_id.empty()
                                 ? nvml_.by_index_(0, &device_)
                                 : nvml_.by_pci_bus_id_(pci_bus_id.c_str(), &device_);
    if (found != kNvmlSuccess) {
      reason_ = "NVML cannot find the GPU " + (pci_bus_id.empty() ? "0" : pci_bus_id) + ": " +
                nvml_.error(found);
      return;
    }
    char name[96] = {};
    if (nvml_.name_(device_, name, sizeof name) == kNvmlSuccess)
      name_ = "gpu (" + std::string(name) + ")";
    unsigned limit_mw = 0;
    if (nvml_.power_limit_(device_, &limit_mw) == kNvmlSuccess)
      power_limit_watts_ = limit_mw * 1e-3;
    unsigned long long energy_mj = 0;
    const NvmlReturn counter = nvml_.total_energy_(device_, &energy_mj);
    if (counter == kNvmlSuccess) return;  // the counter it is
    unsigned power_mw = 0;
    const NvmlReturn power = nvml_.power_(device_, &power_mw);
    if (power != kNvmlSuccess) {
      reason_ = "this GPU reports neither its energy (" + nvml_.error(counter) +
                ") nor its power (" + nvml_.error(power) + ") through NVML";
      return;
    }
    sampled_power_ = true;
  }

  std::string name() const override { return name_; }
  std::string method() const override {
    return sampled_power_
               ? "NVML power draw sampled every " + std::to_string(kPowerSamplePeriod.count()) +
                     " ms (this GPU has no total-energy counter)"
               : "NVML total-energy counter";
  }
  Kind kind() const override { return sampled_power_ ? Kind::kPower : Kind::kCounter; }
  std::string unavailable_reason() const override { return reason_; }
  double power_limit_watts() const override { return power_limit_watts_; }
  std::optional<double> read() override {
    if (sampled_power_) {
      unsigned power_mw = 0;
      if (nvml_.power_(device_, &power_mw) != kNvmlSuccess) return std::nullopt;
      return power_mw * 1e-3;
    }
    unsigned long long energy_mj = 0;
    if (nvml_.total_energy_(device_, &energy_mj) != kNvmlSuccess) return std::nullopt;
    return static_cast<double>(energy_mj) * 1e-3;
  }

 private:
  Nvml nvml_;
  NvmlDevice device_ = nullptr;
  std::string name_ = "gpu";
  std::string reason_;
  bool sampled_power_ = false;
  double power_limit_watts_ = 0.0;
};

}  // namespace

std::unique_ptr<EnergySource> make_nvml_gpu_source(const std::string& pci_bus_id) {
  return std::make_unique<NvmlGpuSource>(pci_bus_id);
}

}  // namespace layup
