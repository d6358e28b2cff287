// The clock report from given samples (median, shares of each reason, the printed line), and the
// sampler on NVML where it is (or is not) installed.
#include "energy/gpu_clocks.h"

#include <gtest/gtest.h>

#include <thread>

#include "energy/nvml_library.h"

namespace layup {
namespace {

using namespace std::chrono_literals;

TEST(GpuClocks, SummarizesTheSamples) {
  const std::vector<ClockSample> samples = {
      {1980, 0},
      {1500, nvml::kReasonSwPowerCap},
      {1620, nvml::kReasonSwPowerCap | nvml::kReasonSwThermal},
      {1260, nvml::kReasonSwPowerCap | nvml::kReasonHwPowerBrake},
  };
  const GpuClockReport report = summarize_clock_samples(samples, 1980);
  ASSERT_TRUE(report.available);
  EXPECT_EQ(report.samples, 4);
  EXPECT_DOUBLE_EQ(report.median_sm_mhz, (1500 + 1620) / 2.0);  // even count: the middle two
  EXPECT_DOUBLE_EQ(report.min_sm_mhz, 1260);
  EXPECT_DOUBLE_EQ(report.max_sm_mhz, 1980);
  EXPECT_DOUBLE_EQ(report.power_cap_share, 0.75);
  EXPECT_DOUBLE_EQ(report.thermal_share, 0.25);
  EXPECT_DOUBLE_EQ(report.hw_slowdown_share, 0.25);
  EXPECT_EQ(describe_clocks(report),
            "SM median 1560 MHz (min 1260, max 1980); held by the power cap in 75% of 4 samples, "
            "thermal slowdown in 25%, hardware slowdown in 25%");

  const std::vector<ClockSample> odd = {{1700, 0}, {1900, 0}, {1800, 0}};
  const GpuClockReport cool = summarize_clock_samples(odd, 0);
  EXPECT_DOUBLE_EQ(cool.median_sm_mhz, 1800);
  // Reasons never seen are not named, nor a maximum NVML did not give.
  EXPECT_EQ(describe_clocks(cool),
            "SM median 1800 MHz (min 1700); held by the power cap in 0% of "
            "3 samples");
  EXPECT_EQ(clocks_json(cool)["power_cap_share"], 0.0);
}

TEST(GpuClocks, NoSamplesIsUnavailable) {
  const GpuClockReport report = summarize_clock_samples({}, 1980);
  EXPECT_FALSE(report.available);
  EXPECT_EQ(describe_clocks(report), "unavailable (no clock was read over the interval)");
  EXPECT_EQ(clocks_json(report)["available"], false);
}

// Where NVML is installed (the GPU machine) the sampler reads clocks; elsewhere it says why not.
TEST(GpuClocks, SamplesTheGpuOrSaysWhyNot) {
  GpuClockSampler sampler("");
  sampler.start();
  std::this_thread::sleep_for(5 * kClockSamplePeriod);
  const GpuClockReport report = sampler.stop();
  if (!report.available) {
    EXPECT_NE(report.unavailable_reason.find("NVML"), std::string::npos)
        << report.unavailable_reason;
    GTEST_SKIP() << "no GPU clocks here: " << report.unavailable_reason;
  }
  EXPECT_GE(report.samples, 1);
  EXPECT_GT(report.median_sm_mhz, 0.0);
  EXPECT_GE(report.max_sm_mhz, report.min_sm_mhz);
}

}  // namespace
}  // namespace layup
