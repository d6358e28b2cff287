// The GPU's clocks over an interval; see gpu_clocks.h.
#include "energy/gpu_clocks.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "energy/nvml_library.h"

namespace layup {

GpuClockReport summarize_clock_samples(const std::vector<ClockSample>& samples, double max_sm_mhz) {
  GpuClockReport report;
  report.max_sm_mhz = max_sm_mhz;
  if (samples.empty()) {
    report.unavailable_reason = "no clock was read over the interval";
    return report;
  }
  report.available = true;
  report.samples = static_cast<int>(samples.size());
  std::vector<unsigned> clocks;
  int power_cap = 0, thermal = 0, hw_slowdown = 0;
  for (const ClockSample& sample : samples) {
    clocks.push_back(sample.sm_mhz);
    power_cap += (sample.reasons & nvml::kReasonSwPowerCap) != 0;
    thermal += (sample.reasons & (nvml::kReasonSwThermal | nvml::kReasonHwThermal)) != 0;
    hw_slowdown += (sample.reasons & (nvml::kReasonHwSlowdown | nvml::kReasonHwPowerBrake)) != 0;
  }
  std::sort(clocks.begin(), clocks.end());
  const size_t n = clocks.size();
  report.median_sm_mhz = n % 2 == 1 ? clocks[n / 2] : (clocks[n / 2 - 1] + clocks[n / 2]) / 2.0;
  report.min_sm_mhz = clocks.front();
  report.power_cap_share = static_cast<double>(power_cap) / n;
  report.thermal_share = static_cast<double>(thermal) / n;
  report.hw_slowdown_share = static_cast<double>(hw_slowdown) / n;
  return report;
}

std::string describe_clocks(const GpuClockReport& report) {
  if (!report.available) return "unavailable (" + report.unavailable_reason + ")";
  char text[256];
  std::snprintf(text, sizeof text, "SM median %.0f MHz (min %.0f", report.median_sm_mhz,
                report.min_sm_mhz);
  std::string line = text;
  if (report.max_sm_mhz > 0) {
    std::snprintf(text, sizeof text, ", max %.0f", report.max_sm_mhz);
    line += text;
  }
  std::snprintf(text, sizeof text, "); held by the power cap in %.0f%% of %d samples",
                100.0 * report.power_cap_share, report.samples);
  line += text;
  if (report.thermal_share > 0) {
    std::snprintf(text, sizeof text, ", thermal slowdown in %.0f%%", 100.0 * report.thermal_share);
    line += text;
  }
  if (report.hw_slowdown_share > 0) {
    std::snprintf(text, sizeof text, ", hardware slowdown in %.0f%%",
                  100.0 * report.hw_slowdown_share);
    line += text;
  }
  return line;
}

nlohmann::json clocks_json(const GpuClockReport& report) {
  if (!report.available)
    return {{"available", false}, {"unavailable_reason", report.unavailable_reason}};
  return {{"available", true},
          {"method", "NVML SM clock and clock-event reasons, sampled every " +
                         std::to_string(kClockSamplePeriod.count()) + " ms"},
          {"samples", report.samples},
          {"median_sm_mhz", report.median_sm_mhz},
          {"min_sm_mhz", report.min_sm_mhz},
          {"max_sm_mhz", report.max_sm_mhz},
          {"power_cap_share", report.power_cap_share},
          {"thermal_share", report.thermal_share},
          {"hw_slowdown_share", report.hw_slowdown_share}};
}

struct GpuClockSampler::State {
  nvml::Library nvml;
  nvml::Device device = nullptr;
  std::string reason;  // why this GPU's clocks cannot be read (empty: they can)
  double max_sm_mhz = 0.0;
};

GpuClockSampler::GpuClockSampler(const std::string& pci_bus_id)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  if (!s.nvml.reason().empty()) {
    s.reason = s.nvml.reason();
    return;
  }
  if (s.nvml.clock == nullptr || s.nvml.clock_reasons == nullptr) {
    s.reason = "this NVML cannot read clocks or their reasons (an old driver?)";
    return;
  }
  s.device = s.nvml.find(pci_bus_id, s.reason);
  if (s.device == nullptr) return;
  unsigned max_mhz = 0;
  if (s.nvml.max_clock != nullptr &&
      s.nvml.max_clock(s.device, nvml::kClockSm, &max_mhz) == nvml::kSuccess)
    s.max_sm_mhz = max_mhz;
}

GpuClockSampler::~GpuClockSampler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (sampler_.joinable()) sampler_.join();
}

void GpuClockSampler::start() {
  LAYUP_CHECK(!sampler_.joinable(), "GpuClockSampler::start called twice");
  if (!state_->reason.empty()) return;
  sampler_ = std::thread([this] { sample_loop(); });
}

void GpuClockSampler::sample_loop() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    ClockSample sample;
    const bool read = s.nvml.clock(s.device, nvml::kClockSm, &sample.sm_mhz) == nvml::kSuccess &&
                      s.nvml.clock_reasons(s.device, &sample.reasons) == nvml::kSuccess;
    if (read)
      samples_.push_back(sample);
    else
      failed_ = true;
    wake_.wait_for(lock, kClockSamplePeriod, [this] { return stopping_; });
  }
}

GpuClockReport GpuClockSampler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (sampler_.joinable()) sampler_.join();
  if (!state_->reason.empty()) {
    GpuClockReport report;
    report.unavailable_reason = state_->reason;
    return report;
  }
  if (failed_) {
    GpuClockReport report;
    report.unavailable_reason = "a clock read failed during the interval";
    return report;
  }
  return summarize_clock_samples(samples_, state_->max_sm_mhz);
}

}  // namespace layup
