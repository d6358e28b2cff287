// The disk tier's space rule (5% of the file system kept back, at least 1 GiB) and statvfs read
// on this machine's temp directory.
#include "tier/disk_space.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io/test_files.h"

namespace layup {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

TEST(DiskSpace, TheReserveIsFivePercentOfTheFileSystemAndAtLeastOneGiB) {
  EXPECT_EQ(disk_reserve(252 * kGiB), 252 * kGiB / 20);
  EXPECT_EQ(disk_reserve(8 * kGiB), kGiB);
  const DiskSpace space = disk_space("/data", 100 * kGiB, 30 * kGiB);
  EXPECT_EQ(space.reserve_bytes, 5 * kGiB);
  EXPECT_EQ(space.usable_bytes(), 25 * kGiB);
  EXPECT_EQ(space.describe(),
            "/data: 25.00 GiB usable (30.00 GiB free of 100.00 GiB, less a reserve of 5.00 GiB)");
  EXPECT_EQ(disk_space("/small", 10 * kGiB, kGiB / 2).usable_bytes(), 0u);
}

TEST(DiskSpace, ASmallFileSystemSaysItIsAllReserve) {
  const DiskSpace space = disk_space("/small", 800 * (size_t{1} << 20), 512 * (size_t{1} << 20));
  EXPECT_EQ(space.usable_bytes(), 0u);
  EXPECT_EQ(space.describe(),
            "/small: 0 B usable (512.0 MiB free of 800.0 MiB, all of it within the reserve of "
            "1.00 GiB kept back on every file system: 5% of its size, at least 1 GiB, for logs, "
            "checkpoints and other processes)");
}

TEST(DiskSpace, ThisMachinesTempDirectoryHasSomeSpace) {
  test_files::TempDir dir;
  const DiskSpace space = read_disk_space(dir.path());
  EXPECT_GT(space.total_bytes, 0u);
  EXPECT_LE(space.free_bytes, space.total_bytes);
  EXPECT_EQ(space.reserve_bytes, disk_reserve(space.total_bytes));
  const size_t free = disk_free_bytes(dir.path());
  // Other processes write to the same disk meanwhile: close, not equal.
  EXPECT_NEAR(static_cast<double>(free), static_cast<double>(space.free_bytes), 1e9);
}

TEST(DiskSpace, AMissingDirectoryOrAFileIsNamed) {
  test_files::TempDir dir;
  const std::string missing = dir.file("missing");
  EXPECT_TRUE(test_files::contains(
      test_files::error_message([&] { read_disk_space(missing); }),
      "cannot read the free space of " + missing + ": No such file or directory"));
  const std::string file = dir.file("file");
  test_files::write_text(file, "x");
  EXPECT_TRUE(test_files::contains(test_files::error_message([&] { read_disk_space(file); }),
                                   "it is not a directory"));
}

// The trainer subtracts the disk tier's file from its checkpoints' room only where both share a
// file system: a directory and its own subdirectory do; /proc (a file system of its own) and the
// temp directory do not; a missing path is not taken for a match.
TEST(DiskSpace, SameFileSystemComparesTheDevices) {
  const std::string temp = std::filesystem::temp_directory_path().string();
  EXPECT_TRUE(same_file_system(temp, temp));
  EXPECT_FALSE(same_file_system("/proc", temp));
  EXPECT_FALSE(same_file_system(temp + "/layup-no-such-directory", temp));
}

}  // namespace
}  // namespace layup
