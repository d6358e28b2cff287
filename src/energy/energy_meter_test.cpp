// The energy meter with scripted sources (integration, wraps, failures), the RAPL reader on a
// fake powercap tree, and NVML where it is (or is not) installed.
#include "energy/energy_meter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "energy/nvml_energy.h"
#include "energy/rapl_energy.h"

namespace layup {
namespace {

using namespace std::chrono_literals;

// Fast polling, so a short interval sees many reads.
constexpr EnergyPollPeriods kFast{std::chrono::milliseconds(1), std::chrono::milliseconds(1)};

class ConstantPower final : public EnergySource {
 public:
  explicit ConstantPower(double watts) : watts_(watts) {}
  std::string name() const override { return "constant"; }
  std::string method() const override { return "test power"; }
  Kind kind() const override { return Kind::kPower; }
  std::string unavailable_reason() const override { return ""; }
  std::optional<double> read() override { return watts_; }

 private:
  double watts_;
};

// A counter that advances by `step` joules at every read and wraps at `wrap`, counting its reads:
// whatever the timing, the energy over the interval is step x (reads - 1).
class SteppingCounter final : public EnergySource {
 public:
  SteppingCounter(double step, double wrap, std::atomic<int>& reads, int fail_at = -1)
      : step_(step), wrap_(wrap), reads_(reads), fail_at_(fail_at) {}
  std::string name() const override { return "stepping"; }
  std::string method() const override { return "test counter"; }
  Kind kind() const override { return Kind::kCounter; }
  std::string unavailable_reason() const override { return ""; }
  double wrap_joules() const override { return wrap_; }
  std::optional<double> read() override {
    const int read = reads_++;
    if (read == fail_at_) return std::nullopt;
    return std::fmod(read * step_, wrap_);
  }

 private:
  double step_, wrap_;
  std::atomic<int>& reads_;
  int fail_at_;
};

// Waits until the poller has read `count` times: a loaded machine (the sanitizers' CI on two
// cores) may run the poller far later than its period, so a fixed sleep would see fewer reads.
void wait_for_reads(const std::atomic<int>& reads, int count) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (reads.load() < count && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_GE(reads.load(), count) << "the poller did not read the source in 60 s";
}

TEST(EnergyMeter, IntegratesPowerOverTheInterval) {
  std::vector<std::unique_ptr<EnergySource>> sources;
  sources.push_back(std::make_unique<ConstantPower>(250.0));
  EnergyMeter meter(std::move(sources), kFast);
  meter.start();
  std::this_thread::sleep_for(30ms);
  const std::vector<EnergyReading> readings = meter.stop();
  ASSERT_EQ(readings.size(), 1u);
  EXPECT_TRUE(readings[0].available) << readings[0].unavailable_reason;
  EXPECT_GE(readings[0].seconds, 0.03);
  // Constant power: the trapezoids add up to power x time, whatever the samples' spacing (the
  // first sample is taken a moment after the interval's start).
  EXPECT_NEAR(readings[0].joules, 250.0 * readings[0].seconds, 250.0 * 1e-3);
  EXPECT_NEAR(readings[0].mean_watts(), 250.0, 250.0 * 0.05);
  // The wall-clock interval that an outside reader matches against spans the same time.
  EXPECT_NEAR(readings[0].stopped_unix_seconds - readings[0].started_unix_seconds,
              readings[0].seconds, 0.01);
  EXPECT_GT(readings[0].started_unix_seconds, 1.7e9);  // a date after 2023, not 0
}

TEST(EnergyMeter, CountsEveryStepOfAWrappingCounter) {
  std::atomic<int> reads{0};
  std::vector<std::unique_ptr<EnergySource>> sources;
  // 30 J per read, wrapping at 100 J: most reads see the counter wrap.
  sources.push_back(std::make_unique<SteppingCounter>(30.0, 100.0, reads));
  EnergyMeter meter(std::move(sources), kFast);
  meter.start();
  wait_for_reads(reads, 5);
  const std::vector<EnergyReading> readings = meter.stop();
  ASSERT_TRUE(readings[0].available) << readings[0].unavailable_reason;
  EXPECT_GT(reads.load(), 5);  // stop() reads once more
  EXPECT_DOUBLE_EQ(readings[0].joules, 30.0 * (reads.load() - 1));
}

TEST(EnergyMeter, AFailedReadMakesTheReadingUnavailableNotSmaller) {
  std::atomic<int> reads{0};
  std::vector<std::unique_ptr<EnergySource>> sources;
  sources.push_back(std::make_unique<SteppingCounter>(1.0, 1e9, reads, /*fail_at=*/2));
  sources.push_back(std::make_unique<ConstantPower>(10.0));
  EnergyMeter meter(std::move(sources), kFast);
  meter.start();
  wait_for_reads(reads, 3);  // the start's read, then the poller's: the third fails
  const std::vector<EnergyReading> readings = meter.stop();
  EXPECT_FALSE(readings[0].available);
  EXPECT_EQ(readings[0].joules, 0.0);
  EXPECT_NE(readings[0].unavailable_reason.find("failed"), std::string::npos);
  EXPECT_NE(describe_energy(readings[0]).find("unavailable"), std::string::npos);
  EXPECT_TRUE(readings[1].available);  // the other source is unaffected
}

TEST(EnergyMeter, RefusesCallsOutOfOrder) {
  std::vector<std::unique_ptr<EnergySource>> sources;
  sources.push_back(std::make_unique<ConstantPower>(1.0));
  EnergyMeter meter(std::move(sources), kFast);
  EXPECT_THROW(meter.stop(), Error);
  EXPECT_THROW(meter.snapshot(), Error);
  meter.start();
  EXPECT_THROW(meter.start(), Error);
  EXPECT_EQ(meter.snapshot().size(), 1u);
  EXPECT_EQ(meter.stop().size(), 1u);
  meter.start();  // a second interval after the first
  EXPECT_TRUE(meter.stop()[0].available);
}

// A powercap tree as Linux lays it out: packages intel-rapl:N, their parts intel-rapl:N:M.
class FakePowercap : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("powercap_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void domain(const std::string& dir, const std::string& name, const std::string& energy_uj,
              const std::string& range_uj) {
    const std::filesystem::path path = root_ / dir;
    std::filesystem::create_directories(path);
    std::ofstream(path / "name") << name << "\n";
    std::ofstream(path / "energy_uj") << energy_uj << "\n";
    if (!range_uj.empty()) std::ofstream(path / "max_energy_range_uj") << range_uj << "\n";
  }
  std::filesystem::path root_;
};

TEST_F(FakePowercap, ReadsEveryPackageAndNotTheirParts) {
  domain("intel-rapl:0", "package-0", "123456789", "262143328850");
  domain("intel-rapl:0:0", "dram", "5", "262143328850");
  domain("intel-rapl:1", "package-1", "1000000", "262143328850");
  std::vector<std::unique_ptr<EnergySource>> sources = rapl_package_sources(root_.string());
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0]->name(), "cpu package-0");
  EXPECT_EQ(sources[1]->name(), "cpu package-1");
  EXPECT_EQ(sources[0]->unavailable_reason(), "");
  EXPECT_EQ(sources[0]->kind(), EnergySource::Kind::kCounter);
  EXPECT_DOUBLE_EQ(*sources[0]->read(), 123.456789);
  EXPECT_DOUBLE_EQ(sources[0]->wrap_joules(), 262143.32885);
}

TEST_F(FakePowercap, SaysWhyWhereThereIsNothingToRead) {
  std::vector<std::unique_ptr<EnergySource>> none = rapl_package_sources(root_.string());
  ASSERT_EQ(none.size(), 1u);
  EXPECT_NE(none[0]->unavailable_reason().find("cannot be read"), std::string::npos)
      << none[0]->unavailable_reason();

  std::filesystem::create_directories(root_);
  std::vector<std::unique_ptr<EnergySource>> empty = rapl_package_sources(root_.string());
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_NE(empty[0]->unavailable_reason().find("no RAPL package domain"), std::string::npos);

  // Without the counter's range a wrap could not be told apart from a reset.
  domain("intel-rapl:0", "package-0", "1", "");
  std::vector<std::unique_ptr<EnergySource>> rangeless = rapl_package_sources(root_.string());
  ASSERT_EQ(rangeless.size(), 1u);
  EXPECT_NE(rangeless[0]->unavailable_reason().find("max_energy_range_uj"), std::string::npos);
}

// Where NVML is installed (the GPU machine) the GPU's counter reads and does not go backwards;
// elsewhere the source says that NVML is missing.
TEST(NvmlEnergy, ReadsTheGpuOrSaysWhyNot) {
  std::unique_ptr<EnergySource> gpu = make_nvml_gpu_source("");
  const std::string reason = gpu->unavailable_reason();
  if (!reason.empty()) {
    EXPECT_NE(reason.find("NVML"), std::string::npos) << reason;
    GTEST_SKIP() << "no GPU energy here: " << reason;
  }
  const std::optional<double> first = gpu->read();
  std::this_thread::sleep_for(50ms);
  const std::optional<double> second = gpu->read();
  ASSERT_TRUE(first && second);
  if (gpu->kind() == EnergySource::Kind::kCounter) {
    EXPECT_GE(*second, *first);
  }
  EXPECT_GT(gpu->power_limit_watts(), 0.0);
}

}  // namespace
}  // namespace layup
