// The GPU's energy through NVML; see nvml_energy.h.
#include "energy/nvml_energy.h"

#include <optional>
#include <string>

#include "energy/nvml_library.h"

namespace layup {

namespace {

class NvmlGpuSource final : public EnergySource {
 public:
  explicit NvmlGpuSource(const std::string& pci_bus_id) {
    if (!nvml_.reason().empty()) {
      reason_ = nvml_.reason();
      return;
    }
    device_ = nvml_.find(pci_bus_id, reason_);
    if (device_ == nullptr) return;
    char name[96] = {};
    if (nvml_.name(device_, name, sizeof name) == nvml::kSuccess)
      name_ = "gpu (" + std::string(name) + ")";
    unsigned limit_mw = 0;
    if (nvml_.power_limit(device_, &limit_mw) == nvml::kSuccess)
      power_limit_watts_ = limit_mw * 1e-3;
    unsigned long long energy_mj = 0;
    const nvml::Return counter = nvml_.total_energy(device_, &energy_mj);
    if (counter == nvml::kSuccess) return;  // the counter it is
    unsigned power_mw = 0;
    const nvml::Return power = nvml_.power(device_, &power_mw);
    if (power != nvml::kSuccess) {
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
      if (nvml_.power(device_, &power_mw) != nvml::kSuccess) return std::nullopt;
      return power_mw * 1e-3;
    }
    unsigned long long energy_mj = 0;
    if (nvml_.total_energy(device_, &energy_mj) != nvml::kSuccess) return std::nullopt;
    return static_cast<double>(energy_mj) * 1e-3;
  }

 private:
  nvml::Library nvml_;
  nvml::Device device_ = nullptr;
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
