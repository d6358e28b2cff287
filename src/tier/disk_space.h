// What the file system under a directory (the run's --offload-dir) can give the disk tier: its
// free space as statvfs reports it to an unprivileged process, less a reserve, for the planner.
#pragma once

#include <cstddef>
#include <string>

namespace layup {

struct DiskSpace {
  std::string dir;           // the directory asked about, for messages
  size_t total_bytes = 0;    // the file system's size
  size_t free_bytes = 0;     // free to an unprivileged process (f_bavail)
  size_t reserve_bytes = 0;  // kept back for logs, checkpoints and everyone else

  // What a run may plan to keep on this file system: free less the reserve.
  size_t usable_bytes() const;
  // "/data: 41.14 GiB usable (53.74 GiB free of 252.00 GiB, less a reserve of 12.60 GiB)", and
  // where the reserve takes all that is free, that it does and what the reserve is for.
  std::string describe() const;
};

// The reserve kept back from a file system of `total_bytes`: 5% of it, at least 1 GiB.
size_t disk_reserve(size_t total_bytes);

// A DiskSpace from its numbers, with the reserve the rule above gives (for tests and planners that
// model a machine they are not running on).
DiskSpace disk_space(const std::string& dir, size_t total_bytes, size_t free_bytes);

// Reads the space of the file system holding `dir` with statvfs. Throws layup::Error naming the
// directory and the reason when it cannot (the directory does not exist, is not a directory, or
// may not be searched).
DiskSpace read_disk_space(const std::string& dir);

// read_disk_space(dir).free_bytes.
size_t disk_free_bytes(const std::string& dir);

// Whether two existing directories lie on one file system (stat's st_dev); false when either
// cannot be read.
bool same_file_system(const std::string& a, const std::string& b);

}  // namespace layup
