// Reading the host memory a run may use: /proc/meminfo and the process's cgroups (v1 and v2).
#include "memory/host_memory.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

// cgroup v1 writes "no limit" as a huge page-aligned number (LONG_MAX rounded down to a page).
constexpr size_t kNoLimitAbove = size_t{1} << 60;

// A value the kernel wrote as a count of `unit` bytes. The kernel never writes a negative or
// non-numeric one, so such a file is damaged or not the kernel's (LAYUP_SYSTEM_ROOT's). It is
// refused rather than read as "unknown": the check it feeds is what keeps a run from being ended
// by the out-of-memory killer, and a number that cannot be trusted bounds nothing (read unsigned,
// "-1" would pass as 16 EiB). A count too large for size_t saturates: in a cgroup, "no limit".
size_t parse_count(const std::string& text, size_t unit, const fs::path& path,
                   const std::string& what) {
  const auto refuse = [&](const char* why) {
    fail(path.string(), ": ", what, " is '", text, "', ", why,
         ", so the host memory a run may use is unknown; the file is damaged or not the "
         "kernel's. Fix it, or give --allow-overcommit (where a command takes it) to run without "
         "the host memory check");
  };
  const char* const begin = text.data();
  const char* const end = begin + text.size();
  const bool negative = !text.empty() && text.front() == '-';
  unsigned long long value = 0;
  const auto [stop, error] = std::from_chars(begin + (negative ? 1 : 0), end, value);
  const bool digits = stop == end && error != std::errc::invalid_argument;
  if (!digits) refuse("not a number");
  if (negative) refuse("negative");
  if (error == std::errc::result_out_of_range || value > std::numeric_limits<size_t>::max() / unit)
    return std::numeric_limits<size_t>::max();
  return static_cast<size_t>(value) * unit;
}

// A cgroup's limit or usage file: absent, "max" or cgroup v1's huge "no limit" give nothing.
std::optional<size_t> read_number(const fs::path& path, const std::string& what) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  const size_t value = parse_count(text, 1, path, what);
  if (value >= kNoLimitAbove) return std::nullopt;
  return value;
}

// A "key value" line of a stat file (memory.stat, or /proc/meminfo with its "kB").
std::optional<size_t> read_field(const fs::path& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, value, unit;
    if (!(fields >> name)) continue;
    if (!name.empty() && name.back() == ':') name.pop_back();
    if (name != key) continue;
    fields >> value >> unit;
    return parse_count(value, unit == "kB" ? 1024 : 1, path, key);
  }
  return std::nullopt;
}

struct CgroupFiles {
  const char* limit;
  const char* usage;
};

// The cgroup's limit less what it holds that the kernel cannot simply drop (inactive page cache
// can be reclaimed, so it does not count as held), at `dir` and each parent up to `top`; the
// tightest one is kept in `limit`.
void tightest_cgroup(const fs::path& top, fs::path dir, const CgroupFiles& files,
                     HostMemoryLimit& limit) {
  while (true) {
    const std::optional<size_t> max = read_number(dir / files.limit, "the cgroup's limit");
    if (max) {
      const size_t usage = read_number(dir / files.usage, "the cgroup's usage").value_or(0);
      const size_t reclaimable = read_field(dir / "memory.stat", "inactive_file").value_or(0);
      const size_t held = usage > reclaimable ? usage - reclaimable : 0;
      const size_t free = *max > held ? *max - held : 0;
      if (!limit.cgroup_free_bytes || free < *limit.cgroup_free_bytes) {
        limit.cgroup_free_bytes = free;
        limit.cgroup_limit_bytes = *max;
        const fs::path relative = fs::relative(dir, top);
        limit.cgroup = (fs::path("/") / (relative == "." ? fs::path() : relative)).string();
      }
    }
    if (dir == top || !dir.has_parent_path() || dir.parent_path() == dir) return;
    dir = dir.parent_path();
  }
}

}  // namespace

size_t HostMemoryLimit::usable_bytes() const {
  const size_t limit = std::min(available_bytes, cgroup_free_bytes.value_or(available_bytes));
  return limit > reserve_bytes ? limit - reserve_bytes : 0;
}

std::string HostMemoryLimit::describe() const {
  std::string text =
      format_bytes(usable_bytes()) + " (MemAvailable " + format_bytes(available_bytes);
  if (cgroup_free_bytes)
    text += ", cgroup " + cgroup + " limit " + format_bytes(*cgroup_limit_bytes) + " with " +
            format_bytes(*cgroup_free_bytes) + " free";
  else
    text += ", no cgroup limit";
  return text + ", less a reserve of " + format_bytes(reserve_bytes) + ")";
}

size_t host_memory_reserve(size_t bytes) {
  return std::max(bytes / 20, size_t{512} << 20);
}

HostMemoryLimit read_host_memory_limit(const std::string& root) {
  const fs::path base(root);
  HostMemoryLimit limit;
  const std::optional<size_t> available = read_field(base / "proc/meminfo", "MemAvailable");
  LAYUP_CHECK(available, "cannot read MemAvailable from ", (base / "proc/meminfo").string(),
              ", so the host memory this run may use is unknown");
  LAYUP_CHECK(*available < kNoLimitAbove, (base / "proc/meminfo").string(), ": MemAvailable is ",
              format_bytes(*available),
              ", more than any machine has; the file is damaged or not the kernel's");
  limit.available_bytes = *available;

  // Lines of /proc/self/cgroup: "0::/path" (v2), "4:memory:/path" (v1).
  std::ifstream cgroups(base / "proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    const bool v2 = line.substr(0, first) == "0" && controllers.empty();
    const bool v1_memory = controllers == "memory" ||
                           controllers.find("memory,") != std::string::npos ||
                           controllers.ends_with(",memory");
    if (!v2 && !v1_memory) continue;
    const fs::path top = base / (v2 ? "sys/fs/cgroup" : "sys/fs/cgroup/memory");
    const CgroupFiles files = v2 ? CgroupFiles{"memory.max", "memory.current"}
                                 : CgroupFiles{"memory.limit_in_bytes", "memory.usage_in_bytes"};
    // Inside a container the path may name the host's hierarchy, which is not mounted here;
    // then the mount's root is this process's cgroup.
    fs::path dir = top / fs::path(path).relative_path();
    std::error_code error;
    if (!fs::is_directory(dir, error)) dir = top;
    if (fs::is_directory(dir, error)) tightest_cgroup(top, dir, files, limit);
  }
  limit.reserve_bytes = host_memory_reserve(
      std::min(limit.available_bytes, limit.cgroup_limit_bytes.value_or(limit.available_bytes)));
  return limit;
}

namespace {

// Set at start-up (set_system_root), then only read.
std::string& system_root() {
  static std::string root = "/";
  return root;
}

}  // namespace

HostMemoryLimit read_host_memory_limit() {
  return read_host_memory_limit(system_root());
}

void set_system_root(const std::string& root) {
  system_root() = root.empty() ? "/" : root;
}

}  // namespace layup
