// Outputs checked before the work that produces them: a command that would run for minutes and
// only then fail to write its result (a missing or read-only folder, /proc, a full file system, a
// file size limit) is refused at its start instead, naming the flag and the value as given.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "tier/disk_space.h"

namespace layup {

// The room asked for a small result (a --json file, the calibration cache): well over its size.
inline constexpr size_t kSmallOutputBytes = size_t{1} << 20;

// What to do when the folder an output goes into does not exist yet.
enum class MissingFolder {
  kRefuse,  // the command writes into it as it is: the user must create it
  kMade,    // the command creates it (e.g. the calibration cache): its nearest existing ancestor
            // must be writable
};

// Refuses `path` as the output of `flag` (e.g. "--json") when it names a folder or a special file
// (a device, a pipe), when its folder does not exist (kRefuse) or cannot be written (a read-only
// or virtual file system such as /proc, or no permission: a probe file is created there and
// removed), or when that file system has less than `bytes_needed` free.
void check_output_file(const std::string& path, const std::string& flag, size_t bytes_needed,
                       MissingFolder missing = MissingFolder::kRefuse);

// The same for a folder that outputs (or a scratch file) go into: a writable folder (or, kMade,
// one under a writable folder) with `bytes_needed` free.
void check_output_folder(const std::string& dir, const std::string& flag, size_t bytes_needed,
                         MissingFolder missing = MissingFolder::kRefuse);

// Refuses `bytes_needed` more on the file system of `space` (free, not usable: an output is not
// the disk tier's state and takes no reserve) for the output `path` of `flag`.
void check_output_room(const DiskSpace& space, size_t bytes_needed, const std::string& path,
                       const std::string& flag);

// The soft RLIMIT_FSIZE of this process in bytes (`ulimit -f` counts KiB), none when unlimited.
std::optional<size_t> file_size_limit_bytes();

// Refuses a file of `file_bytes` (`what`: which file, for the message) that a file size limit of
// `limit_bytes` would cut short; `fixes` are the flags that would write smaller files, after the
// `ulimit -f unlimited` every case has.
void check_file_size_limit(size_t file_bytes, const std::string& what,
                           std::optional<size_t> limit_bytes, const std::string& fixes);

}  // namespace layup
