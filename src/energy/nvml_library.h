// NVML, the NVIDIA driver's management library, opened with dlopen when first needed so that
// layup builds and runs where there is no driver. Only the entry points layup reads are declared,
// with the signatures of NVML's documented C API (nvml.h is not needed to build). Shared by the
// GPU energy source (nvml_energy.h) and the clock sampler (gpu_clocks.h).
#pragma once

#include <string>

namespace layup::nvml {

using Return = int;  // nvmlReturn_t: NVML_SUCCESS is 0
constexpr Return kSuccess = 0;
struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t
constexpr int kClockSm = 1;    // nvmlClockType_t NVML_CLOCK_SM

// The bits of nvmlDeviceGetCurrentClocksEventReasons this file names (nvmlClocksEventReason*).
constexpr unsigned long long kReasonSwPowerCap = 0x4;
constexpr unsigned long long kReasonHwSlowdown = 0x8;
constexpr unsigned long long kReasonSwThermal = 0x20;
constexpr unsigned long long kReasonHwThermal = 0x40;
constexpr unsigned long long kReasonHwPowerBrake = 0x80;

// One initialization of NVML and the entry points. reason() is empty when the library, its
// required entry points and nvmlInit all worked; the clock entry points are optional (null on a
// driver without them).
class Library {
 public:
  Library();
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const std::string& reason() const { return reason_; }
  std::string error(Return status) const;
  // The GPU with this PCI bus id (empty: device 0); on failure, why, in `why`.
  Device find(const std::string& pci_bus_id, std::string& why) const;

  Return (*init)() = nullptr;
  Return (*shutdown)() = nullptr;
  const char* (*error_string)(Return) = nullptr;
  Return (*by_index)(unsigned, Device*) = nullptr;
  Return (*by_pci_bus_id)(const char*, Device*) = nullptr;
  Return (*name)(Device, char*, unsigned) = nullptr;
  Return (*total_energy)(Device, unsigned long long*) = nullptr;   // mJ
  Return (*power)(Device, unsigned*) = nullptr;                    // mW
  Return (*power_limit)(Device, unsigned*) = nullptr;              // mW
  Return (*clock)(Device, int, unsigned*) = nullptr;               // MHz, optional
  Return (*max_clock)(Device, int, unsigned*) = nullptr;           // MHz, optional
  Return (*clock_reasons)(Device, unsigned long long*) = nullptr;  // optional

 private:
  void* library_ = nullptr;
  bool initialized_ = false;
  std::string reason_;
};

}  // namespace layup::nvml
