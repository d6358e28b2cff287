// The side commands' host memory check: a need beyond what the machine can give is refused naming
// the flag that sizes it and the largest value that fits, and that value does fit.
#include "memory/host_memory_need.h"

#include <gtest/gtest.h>

#include "engine/calibration.h"
#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;

constexpr size_t kGiB = size_t{1} << 30;

// A machine with 16 GiB available, no cgroup limit and a reserve of 1 GiB: 15 GiB usable.
HostMemoryLimit machine_with_15_gib_usable() {
  HostMemoryLimit machine;
  machine.available_bytes = 16 * kGiB;
  machine.reserve_bytes = kGiB;
  return machine;
}

TEST(HostMemoryNeed, ANeedWithinTheUsableMemoryPasses) {
  check_host_memory_need(15 * kGiB, machine_with_15_gib_usable(), "x", "y");
}

TEST(HostMemoryNeed, ANeedBeyondItNamesBothSizesAndTheFix) {
  const std::string message = error_message([] {
    check_host_memory_need(46 * kGiB, machine_with_15_gib_usable(),
                           "bench-adamw --params 1649217280 (7 arrays of floats)",
                           "give --params at most 575525617");
  });
  EXPECT_EQ(message,
            "bench-adamw --params 1649217280 (7 arrays of floats) needs 46.00 GiB of host memory, "
            "but this machine can give 15.00 GiB (MemAvailable 16.00 GiB, no cgroup limit, less a "
            "reserve of 1.00 GiB); give --params at most 575525617");
}

TEST(HostMemoryNeed, TheLargestFittingCountFitsAndOneMoreDoesNot) {
  const size_t usable = 15 * kGiB;
  const size_t largest = largest_fitting(usable, kGiB, 28);
  EXPECT_LE(kGiB + largest * 28, usable);
  EXPECT_GT(kGiB + (largest + 1) * 28, usable);
  EXPECT_EQ(largest_fitting(usable, 16 * kGiB, 28), 0u);
  EXPECT_EQ(format_flag_value(1e9), "1000000000");
  EXPECT_EQ(format_flag_value(0.5), "0.5");
}

TEST(CalibrationHostMemory, TooManyCpuParamsNamesTheFlagAndAValueThatFits) {
  CalibrationOptions options;
  options.target.device = DeviceKind::kCpu;
  options.link_bytes = size_t{16} << 20;
  options.cpu_params = size_t{1100} * 1000 * 1000;  // --cpu-mparams 1100: 17.6 GB
  const HostMemoryLimit machine = machine_with_15_gib_usable();
  const std::string message =
      error_message([&] { check_calibration_host_memory(options, machine); });
  EXPECT_TRUE(contains(message, "calibrate's CPU AdamW (--cpu-mparams 1100: 4 arrays of floats)"));
  EXPECT_TRUE(contains(message, "of host memory, but this machine can give 15.00 GiB"));
  EXPECT_FALSE(contains(message, "--batch"));
  const size_t at = message.find("give --cpu-mparams at most ");
  ASSERT_NE(at, std::string::npos) << message;
  const double largest = std::stod(message.substr(at + 27));
  EXPECT_GT(largest, 900);
  options.cpu_params = static_cast<size_t>(largest * 1e6);
  check_calibration_host_memory(options, machine);
}

TEST(CalibrationHostMemory, LargeCopiesNameLinkMib) {
  CalibrationOptions options;
  options.target.device = DeviceKind::kCpu;
  options.link_bytes = 10 * kGiB;  // both ends on the host: 20 GiB
  options.cpu_params = 1 << 20;
  const std::string message =
      error_message([&] { check_calibration_host_memory(options, machine_with_15_gib_usable()); });
  EXPECT_TRUE(contains(message, "calibrate's copies (--link-mib 10240, 2 buffer(s))"));
  EXPECT_TRUE(contains(message, "give --link-mib at most 7672"));
}

}  // namespace
}  // namespace layup
