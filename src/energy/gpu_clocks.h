// What the GPU's SM clock did over an interval, and why the driver held it below its maximum:
// sampled through NVML (nvml_library.h) on a background thread. A GPU at its power limit runs
// every kernel at a lower clock, so a step's time then follows the energy it needs, not its
// kernels' time at full clock: `layup bench` prints this beside the step times so that a reader
// can tell the two cases apart.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace layup {

constexpr std::chrono::milliseconds kClockSamplePeriod{20};

// One reading: the SM clock and the driver's reasons for holding it down (NVML's bit mask).
struct ClockSample {
  unsigned sm_mhz = 0;
  unsigned long long reasons = 0;
};

struct GpuClockReport {
  bool available = false;
  std::string unavailable_reason;  // why not, when not available
  int samples = 0;
  double median_sm_mhz = 0.0, min_sm_mhz = 0.0;
  double max_sm_mhz = 0.0;  // the GPU's maximum SM clock (0 where NVML does not say)
  // Shares of the samples in which the driver named each reason (0..1).
  double power_cap_share = 0.0;    // the software power cap (the board's power limit)
  double thermal_share = 0.0;      // software or hardware thermal slowdown
  double hw_slowdown_share = 0.0;  // hardware slowdown or power brake
};

// The report of these samples (available when there is at least one).
GpuClockReport summarize_clock_samples(const std::vector<ClockSample>& samples, double max_sm_mhz);

// "SM median 1605 MHz (min 1260, max 1980); held by the power cap in 96% of samples" (thermal
// and hardware slowdowns named only where seen), or "unavailable (...)".
std::string describe_clocks(const GpuClockReport& report);
nlohmann::json clocks_json(const GpuClockReport& report);

// Samples the GPU with this PCI bus id (empty: NVML's device 0) every kClockSamplePeriod between
// start() and stop(). Where NVML or its clock entry points are missing, stop() says why.
class GpuClockSampler {
 public:
  explicit GpuClockSampler(const std::string& pci_bus_id);
  ~GpuClockSampler();
  GpuClockSampler(const GpuClockSampler&) = delete;
  GpuClockSampler& operator=(const GpuClockSampler&) = delete;

  void start();
  GpuClockReport stop();

 private:
  struct State;
  void sample_loop();

  std::unique_ptr<State> state_;  // NVML, kept out of this header
  std::vector<ClockSample> samples_;
  bool failed_ = false;
  std::mutex mutex_;  // guards samples_, failed_ and stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread sampler_;
};

}  // namespace layup
