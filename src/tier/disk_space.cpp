// Reading a file system's free space with statvfs, and the reserve the disk tier leaves on it.
#include "tier/disk_space.h"

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

size_t DiskSpace::usable_bytes() const {
  return free_bytes > reserve_bytes ? free_bytes - reserve_bytes : 0;
}

std::string DiskSpace::describe() const {
  const std::string sizes =
      format_bytes(free_bytes) + " free of " + format_bytes(total_bytes) + ", ";
  // A small file system is all reserve (at least 1 GiB): say so, or "0 B usable" reads as a bug.
  if (usable_bytes() == 0 && free_bytes > 0)
    return dir + ": 0 B usable (" + sizes + "all of it within the reserve of " +
           format_bytes(reserve_bytes) +
           " kept back on every file system: 5% of its size, at least 1 GiB, for logs, "
           "checkpoints and other processes)";
  return dir + ": " + format_bytes(usable_bytes()) + " usable (" + sizes + "less a reserve of " +
         format_bytes(reserve_bytes) + ")";
}

size_t disk_reserve(size_t total_bytes) {
  return std::max(total_bytes / 20, size_t{1} << 30);
}

DiskSpace disk_space(const std::string& dir, size_t total_bytes, size_t free_bytes) {
  return {dir, total_bytes, free_bytes, disk_reserve(total_bytes)};
}

DiskSpace read_disk_space(const std::string& dir) {
  struct stat info;
  LAYUP_CHECK(::stat(dir.c_str(), &info) == 0, "cannot read the free space of ", dir, ": ",
              std::strerror(errno), "; give an existing directory as --offload-dir");
  LAYUP_CHECK(S_ISDIR(info.st_mode), "cannot read the free space of ", dir,
              ": it is not a directory; give a directory as --offload-dir");
  struct statvfs space;
  LAYUP_CHECK(::statvfs(dir.c_str(), &space) == 0, "cannot read the free space of ", dir, ": ",
              std::strerror(errno));
  // f_bavail, not f_bfree: the blocks ext4 keeps for root are not ours to plan with.
  const size_t block = space.f_frsize != 0 ? space.f_frsize : space.f_bsize;
  return disk_space(dir, static_cast<size_t>(space.f_blocks) * block,
                    static_cast<size_t>(space.f_bavail) * block);
}

size_t disk_free_bytes(const std::string& dir) {
  return read_disk_space(dir).free_bytes;
}

bool same_file_system(const std::string& a, const std::string& b) {
  struct stat first {};
  struct stat second {};
  return ::stat(a.c_str(), &first) == 0 && ::stat(b.c_str(), &second) == 0 &&
         first.st_dev == second.st_dev;
}

}  // namespace layup
