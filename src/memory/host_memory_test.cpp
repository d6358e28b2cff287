// The host memory limit read from a small fake machine: /proc/meminfo and cgroup files in a
// temporary folder, down the same path the real system is read.
#include "memory/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/test_files.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;

constexpr size_t kGiB = size_t{1} << 30;

class FakeMachine : public ::testing::Test {
 protected:
  void write(const std::string& relative, const std::string& text) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    test_files::write_text(path.string(), text);
  }
  void meminfo(size_t available_kib) {
    write("proc/meminfo",
          "MemTotal:       99999999 kB\nMemFree:         1000 kB\nMemAvailable:   " +
              std::to_string(available_kib) + " kB\n");
  }

  test_files::TempDir dir_;
  fs::path root_ = dir_.path();
};

TEST_F(FakeMachine, WithoutACgroupLimitTheAvailableMemoryLessTheReserveIsUsable) {
  meminfo(24 * 1024 * 1024);  // 24 GiB
  write("proc/self/cgroup", "0::/\n");
  write("sys/fs/cgroup/memory.max", "max\n");
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  EXPECT_EQ(limit.available_bytes, 24 * kGiB);
  EXPECT_FALSE(limit.cgroup_free_bytes);
  EXPECT_EQ(limit.reserve_bytes, 24 * kGiB / 20);
  EXPECT_EQ(limit.usable_bytes(), 24 * kGiB - 24 * kGiB / 20);
  EXPECT_NE(limit.describe().find("no cgroup limit"), std::string::npos) << limit.describe();
}

TEST_F(FakeMachine, ACgroupV2LimitBindsWithItsReclaimableCacheNotCountedAsHeld) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/jobs/run1\n");
  write("sys/fs/cgroup/jobs/run1/memory.max", std::to_string(8 * kGiB) + "\n");
  write("sys/fs/cgroup/jobs/run1/memory.current", std::to_string(3 * kGiB) + "\n");
  write("sys/fs/cgroup/jobs/run1/memory.stat",
        "anon 1073741824\nfile 2147483648\ninactive_file " + std::to_string(2 * kGiB) + "\n");
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  ASSERT_TRUE(limit.cgroup_free_bytes);
  EXPECT_EQ(*limit.cgroup_limit_bytes, 8 * kGiB);
  EXPECT_EQ(*limit.cgroup_free_bytes, 7 * kGiB);  // 8 less the 1 GiB held
  EXPECT_EQ(limit.cgroup, "/jobs/run1");
  EXPECT_EQ(limit.reserve_bytes, size_t{512} << 20);  // 5% of 8 GiB is below the floor
  EXPECT_EQ(limit.usable_bytes(), 7 * kGiB - (size_t{512} << 20));
}

TEST_F(FakeMachine, AParentCgroupsTighterLimitWins) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/outer/inner\n");
  write("sys/fs/cgroup/outer/inner/memory.max", std::to_string(16 * kGiB));
  write("sys/fs/cgroup/outer/memory.max", std::to_string(4 * kGiB));
  write("sys/fs/cgroup/outer/memory.current", std::to_string(kGiB));
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  ASSERT_TRUE(limit.cgroup_free_bytes);
  EXPECT_EQ(*limit.cgroup_free_bytes, 3 * kGiB);
  EXPECT_EQ(limit.cgroup, "/outer");
}

TEST_F(FakeMachine, ACgroupV1LimitIsReadAndItsNoLimitValueIgnored) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/batch\n0::/\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // no limit
  write("sys/fs/cgroup/memory/batch/memory.limit_in_bytes", std::to_string(6 * kGiB));
  write("sys/fs/cgroup/memory/batch/memory.usage_in_bytes", std::to_string(2 * kGiB));
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  ASSERT_TRUE(limit.cgroup_free_bytes);
  EXPECT_EQ(*limit.cgroup_free_bytes, 4 * kGiB);
  EXPECT_EQ(limit.cgroup, "/batch");
}

TEST_F(FakeMachine, AContainersCgroupPathThatIsNotMountedFallsBackToTheMountsRoot) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/kubepods/pod42/container7\n");
  write("sys/fs/cgroup/memory.max", std::to_string(2 * kGiB));
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  ASSERT_TRUE(limit.cgroup_free_bytes);
  EXPECT_EQ(*limit.cgroup_free_bytes, 2 * kGiB);
  EXPECT_EQ(limit.usable_bytes(), 2 * kGiB - (size_t{512} << 20));
}

// The kernel writes no such values: a damaged or fake file is refused naming it and the value as
// written, never read as 16 EiB (a negative count wrapped) or as no limit.
TEST_F(FakeMachine, ANegativeOrUnparsableCountIsAnError) {
  write("proc/self/cgroup", "0::/\n");
  write("proc/meminfo", "MemAvailable:\n");
  EXPECT_TRUE(contains(error_message([&] { read_host_memory_limit(root_.string()); }),
                       "MemAvailable is '', not a number"));
  for (const std::string value : {"-1", "-4096", "12x", "-", "1e9"}) {
    write("proc/meminfo", "MemTotal:       99999999 kB\nMemAvailable:   " + value + " kB\n");
    const std::string message = error_message([&] { read_host_memory_limit(root_.string()); });
    EXPECT_TRUE(contains(
        message, (root_ / "proc/meminfo").string() + ": MemAvailable is '" + value + "', " +
                     (value.starts_with('-') && value != "-" ? "negative" : "not a number")))
        << value;
    EXPECT_TRUE(contains(message, "--allow-overcommit")) << message;
  }
  meminfo(100 * 1024 * 1024);
  write("sys/fs/cgroup/memory.max", "-8589934592\n");
  EXPECT_TRUE(contains(error_message([&] { read_host_memory_limit(root_.string()); }),
                       "memory.max: the cgroup's limit is '-8589934592', negative"));
  write("sys/fs/cgroup/memory.max", std::to_string(8 * kGiB));
  write("sys/fs/cgroup/memory.current", "-1\n");
  EXPECT_TRUE(contains(error_message([&] { read_host_memory_limit(root_.string()); }),
                       "memory.current: the cgroup's usage is '-1', negative"));
  write("sys/fs/cgroup/memory.current", "0\n");
  write("sys/fs/cgroup/memory.stat", "inactive_file -5\n");
  EXPECT_TRUE(contains(error_message([&] { read_host_memory_limit(root_.string()); }),
                       "memory.stat: inactive_file is '-5', negative"));
}

// A count beyond 64 bits is no number a machine has: in MemAvailable an error, in a cgroup's limit
// what cgroup v1's huge number says, no limit.
TEST_F(FakeMachine, ACountBeyondAnyMachineIsAnErrorOrNoLimit) {
  write("proc/self/cgroup", "0::/\n");
  write("proc/meminfo", "MemAvailable:   99999999999999999999 kB\n");
  EXPECT_TRUE(contains(error_message([&] { read_host_memory_limit(root_.string()); }),
                       "more than any machine has"));
  meminfo(24 * 1024 * 1024);
  write("sys/fs/cgroup/memory.max", "99999999999999999999999\n");
  const HostMemoryLimit limit = read_host_memory_limit(root_.string());
  EXPECT_FALSE(limit.cgroup_free_bytes);
  EXPECT_EQ(limit.available_bytes, 24 * kGiB);
}

TEST_F(FakeMachine, AMachineWithoutMeminfoIsAnError) {
  EXPECT_THROW(read_host_memory_limit(root_.string()), Error);
}

TEST(HostMemory, ThisMachineHasSomeUsableMemory) {
  const HostMemoryLimit limit = read_host_memory_limit("/");
  EXPECT_GT(limit.available_bytes, 0u);
  EXPECT_LE(limit.usable_bytes(), limit.available_bytes);
}

}  // namespace
}  // namespace layup
