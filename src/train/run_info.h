// What a benchmark result records about where and how it ran: the command line, the machine, the
// time and the source tree. Shared by `layup bench` and `layup bench-adamw`.
#pragma once

#include <string>

namespace layup {

// The process's own command line, as the kernel has it (arguments joined by spaces).
std::string own_command_line();

// The CPU's model name from /proc/cpuinfo, or "unknown".
std::string cpu_model_name();

std::string hostname();

// Now, in UTC, as 2026-11-30T08:00:00Z.
std::string utc_now();

// layup's version, as CMakeLists.txt's project() gives it: "0.1.0".
std::string layup_version();

// The commit of the source tree this binary was built from, as the build recorded it: the hash,
// with "-dirty" when tracked files differed from it, or "unknown" outside a git checkout.
std::string git_commit();

}  // namespace layup
