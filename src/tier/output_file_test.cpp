// The checks of an output before the work: its folder (missing, a file, virtual, read-only), the
// path (a folder, a device), the room on its file system and the file size limit.
#include "tier/output_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

constexpr size_t kGiB = size_t{1} << 30;

TEST(OutputFile, AWritableFolderPassesAndKeepsNoProbeFile) {
  TempDir dir;
  write_text(dir.file("old.json"), "{}");
  const auto before = snapshot(dir.path());
  check_output_file(dir.file("out.json"), "--json", kSmallOutputBytes);
  check_output_file(dir.file("old.json"), "--json", kSmallOutputBytes);  // replaced later
  check_output_folder(dir.path(), "--out", kSmallOutputBytes);
  EXPECT_EQ(snapshot(dir.path()), before);
}

TEST(OutputFile, AFolderOrADeviceIsNotAFileName) {
  TempDir dir;
  const std::string folder = error_message([&] { check_output_file(dir.path(), "--json", 0); });
  EXPECT_TRUE(contains(folder, "--json " + dir.path() + " is a folder; give a file name"));
  const std::string device = error_message([] { check_output_file("/dev/null", "--trace", 0); });
  EXPECT_TRUE(contains(device, "--trace /dev/null is not a regular file"));
}

TEST(OutputFile, AMissingFolderIsRefusedUnlessTheCommandMakesIt) {
  TempDir dir;
  const std::string path = dir.file("no/such/out.json");
  const std::string message =
      error_message([&] { check_output_file(path, "--json", kSmallOutputBytes); });
  EXPECT_TRUE(contains(message, "--json " + path + ": the folder " + dir.file("no/such") +
                                    " does not exist; create it first"));
  const auto before = snapshot(dir.path());
  check_output_file(path, "--calibration", kSmallOutputBytes, MissingFolder::kMade);
  check_output_folder(dir.file("run/inner"), "--out", 0, MissingFolder::kMade);
  EXPECT_EQ(snapshot(dir.path()), before);  // checked, not made

  write_text(dir.file("file"), "x");
  const std::string under_file = error_message(
      [&] { check_output_folder(dir.file("file/run"), "--out", 0, MissingFolder::kMade); });
  EXPECT_TRUE(contains(under_file, dir.file("file") + " is a file, not a folder"));
}

TEST(OutputFile, AVirtualFileSystemIsNotADisk) {
  // /proc reports no blocks at all: "0 B free" would send the user looking for space.
  const std::string message =
      error_message([] { check_output_file("/proc/out.json", "--json", kSmallOutputBytes); });
  EXPECT_TRUE(contains(message,
                       "--json /proc/out.json: the folder /proc cannot be written (it is "
                       "on a virtual file system"));
  EXPECT_FALSE(contains(message, "free"));
  const std::string folder =
      error_message([] { check_output_folder("/proc/run", "--out", 0, MissingFolder::kMade); });
  EXPECT_TRUE(contains(folder, "--out /proc/run: the folder /proc cannot be written"));
}

TEST(OutputFile, AFolderWithoutWritePermissionIsRefused) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes through permission bits";
  TempDir dir;
  const std::string locked = dir.file("locked");
  std::filesystem::create_directory(locked);
  ::chmod(locked.c_str(), 0555);
  const std::string message =
      error_message([&] { check_output_file(locked + "/out.json", "--json", kSmallOutputBytes); });
  ::chmod(locked.c_str(), 0755);
  EXPECT_TRUE(contains(message, "the folder " + locked + " cannot be written (permission denied)"));
}

TEST(OutputFile, TooLittleRoomNamesBothSizes) {
  const DiskSpace space = disk_space("/data", 100 * kGiB, 512 << 20);
  check_output_room(space, 512 << 20, "/data/trace.json", "--trace");
  const std::string message =
      error_message([&] { check_output_room(space, kGiB, "/data/trace.json", "--trace"); });
  EXPECT_EQ(message,
            "--trace /data/trace.json: the file system of /data has 512.0 MiB free (of 100.00 "
            "GiB) but this needs about 1.00 GiB; free space there or give --trace a path on "
            "another disk");
  // The room of this machine's temp folder is read, not assumed.
  TempDir dir;
  const std::string real =
      error_message([&] { check_output_file(dir.file("x.json"), "--json", size_t{1} << 62); });
  EXPECT_TRUE(contains(real, "but this needs about"));
}

TEST(FileSizeLimit, ALargerFileIsRefusedNamingTheLimitAndTheFixes) {
  check_file_size_limit(10 * kGiB, "the file", std::nullopt, "");
  check_file_size_limit(kGiB, "the file", kGiB, "");
  const std::string message = error_message([] {
    check_file_size_limit(2 * kGiB, "a checkpoint's largest file (model.safetensors)", kGiB,
                          "train without checkpoints (--no-checkpoints)");
  });
  EXPECT_EQ(message,
            "a checkpoint's largest file (model.safetensors) takes 2.00 GiB but this process may "
            "write files of at most 1.00 GiB (ulimit -f 1048576, RLIMIT_FSIZE): it would be cut "
            "short. Raise the limit with `ulimit -f unlimited`, or train without checkpoints "
            "(--no-checkpoints)");
}

TEST(FileSizeLimit, ReadsThisProcesssSoftLimit) {
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &original), 0);
  rlimit lowered = original;
  lowered.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lowered), 0);
  const std::optional<size_t> limit = file_size_limit_bytes();
  TempDir dir;
  const std::string message =
      error_message([&] { check_output_file(dir.file("big.json"), "--json", 2 << 20); });
  ::setrlimit(RLIMIT_FSIZE, &original);
  EXPECT_EQ(limit, std::optional<size_t>(1 << 20));
  EXPECT_TRUE(contains(message, "--json " + dir.file("big.json") + " takes 2.0 MiB"));
  EXPECT_TRUE(contains(message, "ulimit -f 1024"));
}

}  // namespace
}  // namespace layup
