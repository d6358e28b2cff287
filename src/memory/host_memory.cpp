// Reading the host memory a run may use: /proc/meminfo and the process's cgroups (v1 and v2).
#include "memory/host_memory.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

// cgroup v1 writes "no limit" as a huge page-aligned number (LONG_MAX rounded down to a page).
constexpr size_t kNoLimitAbove = size_t{1} << 60;

std::optional<size_t> read_number(const fs::path& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value >= kNoLimitAbove) return std::nullopt;
  return static_cast<size_t>(value);
}

// A "key value" line of a stat file (memory.stat, or /proc/meminfo with its "kB").
std::optional<size_t> read_field(const fs::path& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    unsigned long long value = 0;
    if (!(fields >> name >> value)) continue;
    if (!name.empty() && name.back() == ':') name.pop_back();
    if (name != key) continue;
    std::string unit;
    fields >> unit;
    return static_cast<size_t>(value) * (unit == "kB" ? 1024 : 1);
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
    const std::optional<size_t> max = read_number(dir / files.limit);
    if (max) {
      const size_t usage = read_number(dir / files.usage).value_or(0);
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

HostMemoryLimit read_host_memory_limit() {
  const char* root = std::getenv("LAYUP_SYSTEM_ROOT");
  return read_host_memory_limit(root != nullptr && *root != '\0' ? root : "/");
}

}  // namespace layup
