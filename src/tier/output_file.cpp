// Checking an output's folder, room and file size limit before the work (output_file.h).
#include "tier/output_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

// Why nothing can be written in the existing folder `dir`, or "" when a file can be created there.
// access(W_OK) alone would pass root through a read-only mount's permission bits and says nothing
// of /proc, so a probe file is created (and removed at once).
std::string why_unwritable(const std::string& dir) {
  const std::string probe =
      (fs::path(dir) / (".layup-write-probe-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
  }
  const int error = errno;
  // A folder of /proc or /sys: the kernel's view, with no blocks to write to.
  struct statvfs space;
  if (::statvfs(dir.c_str(), &space) == 0 && space.f_blocks == 0)
    return "it is on a virtual file system, as /proc and /sys are, not a disk";
  if (error == EROFS) return "it is on a read-only file system";
  if (error == EACCES || error == EPERM) return "permission denied";
  return std::strerror(error);
}

void check_writable_folder(const std::string& dir, const std::string& path,
                           const std::string& flag) {
  const std::string why = why_unwritable(dir);
  LAYUP_CHECK(why.empty(), flag, " ", path, ": the folder ", dir, " cannot be written (", why,
              "); give ", flag, " a path in a folder on a disk you may write to");
}

// The folder `folder` if it exists, else (kMade) its nearest ancestor that does: where the output
// of `flag` given as `shown` will be written.
std::string existing_folder(fs::path folder, const std::string& shown, const std::string& flag,
                            MissingFolder missing) {
  std::error_code error;
  if (missing == MissingFolder::kMade) {
    while (!fs::exists(folder, error) && folder.has_parent_path() && folder.parent_path() != folder)
      folder = folder.parent_path();
  }
  const fs::file_status status = fs::status(folder, error);
  LAYUP_CHECK(fs::exists(status), flag, " ", shown, ": the folder ", folder.string(),
              " does not exist; create it first");
  LAYUP_CHECK(fs::is_directory(status), flag, " ", shown, ": ", folder.string(),
              " is a file, not a folder");
  return folder.string();
}

}  // namespace

void check_output_room(const DiskSpace& space, size_t bytes_needed, const std::string& path,
                       const std::string& flag) {
  LAYUP_CHECK(bytes_needed <= space.free_bytes, flag, " ", path, ": the file system of ", space.dir,
              " has ", format_bytes(space.free_bytes), " free (of ",
              format_bytes(space.total_bytes), ") but this needs about ",
              format_bytes(bytes_needed), "; free space there or give ", flag,
              " a path on another disk");
}

void check_output_file(const std::string& path, const std::string& flag, size_t bytes_needed,
                       MissingFolder missing) {
  LAYUP_CHECK(!path.empty(), flag, " needs a file name");
  const fs::path absolute = fs::absolute(path).lexically_normal();
  std::error_code error;
  const fs::file_status status = fs::status(absolute, error);
  LAYUP_CHECK(!fs::is_directory(status), flag, " ", path, " is a folder; give a file name, e.g. ",
              (fs::path(path) / "out.json").string());
  // The file is replaced by a rename: a device or a pipe would be replaced, not written to.
  LAYUP_CHECK(!fs::exists(status) || fs::is_regular_file(status), flag, " ", path,
              " is not a regular file (a device, a pipe or a socket); give the name of a file");
  const std::string folder = existing_folder(absolute.parent_path(), path, flag, missing);
  check_writable_folder(folder, path, flag);
  check_output_room(read_disk_space(folder), bytes_needed, path, flag);
  check_file_size_limit(bytes_needed, flag + " " + path, file_size_limit_bytes(), "");
}

void check_output_folder(const std::string& dir, const std::string& flag, size_t bytes_needed,
                         MissingFolder missing) {
  LAYUP_CHECK(!dir.empty(), flag, " needs a folder");
  const std::string folder =
      existing_folder(fs::absolute(dir).lexically_normal(), dir, flag, missing);
  check_writable_folder(folder, dir, flag);
  check_output_room(read_disk_space(folder), bytes_needed, dir, flag);
}

std::optional<size_t> file_size_limit_bytes() {
  struct rlimit limit;
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return {};
  return static_cast<size_t>(limit.rlim_cur);
}

void check_file_size_limit(size_t file_bytes, const std::string& what,
                           std::optional<size_t> limit_bytes, const std::string& fixes) {
  if (!limit_bytes || file_bytes <= *limit_bytes) return;
  fail(what, " takes ", format_bytes(file_bytes), " but this process may write files of at most ",
       format_bytes(*limit_bytes), " (ulimit -f ", *limit_bytes / 1024,
       ", RLIMIT_FSIZE): it would be cut short. Raise the limit with `ulimit -f unlimited`",
       fixes.empty() ? "" : ", or ", fixes);
}

}  // namespace layup
