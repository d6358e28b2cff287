// What this machine's host memory can give a run: the kernel's MemAvailable and the limit of the
// process's cgroup (v2 memory.max, v1 memory.limit_in_bytes, the tightest on the way to the
// root), less a stated reserve. Every run's plan is checked against it before anything is
// allocated (memory_plan.h, check_budget), so a run that would not fit is refused instead of being
// ended by the kernel's out-of-memory killer.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace layup {

struct HostMemoryLimit {
  size_t available_bytes = 0;                // /proc/meminfo MemAvailable
  std::optional<size_t> cgroup_free_bytes;   // the tightest cgroup: its limit less what it holds
  std::optional<size_t> cgroup_limit_bytes;  // that cgroup's limit
  std::string cgroup;                        // its path, for messages
  size_t reserve_bytes = 0;                  // kept back for the kernel and everything else

  // What a run may plan to hold on the host: min(available, cgroup free) less the reserve.
  size_t usable_bytes() const;
  // "21.3 GiB (MemAvailable 22.4 GiB, cgroup /user.slice limit 24.0 GiB with 23.1 GiB free, less
  // a reserve of 1.1 GiB)".
  std::string describe() const;
};

// The reserve kept back from the machine's host memory: 5% of it, at least 512 MiB.
size_t host_memory_reserve(size_t bytes);

// Reads the limit from `root`/proc/meminfo, `root`/proc/self/cgroup and the cgroup file systems
// under `root`/sys/fs/cgroup. Throws layup::Error when /proc/meminfo cannot be read.
HostMemoryLimit read_host_memory_limit(const std::string& root);

// The same from the system root: "/", or the folder set_system_root gave (the CLI takes it from
// LAYUP_SYSTEM_ROOT, cli/environment.h: tests give a small fake machine through it, down the same
// path).
HostMemoryLimit read_host_memory_limit();

// The root read_host_memory_limit() reads under from now on; empty: "/". Given once at start-up.
void set_system_root(const std::string& root);

}  // namespace layup
