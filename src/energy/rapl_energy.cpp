// RAPL package counters through powercap; see rapl_energy.h.
#include "energy/rapl_energy.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace layup {

namespace {

namespace fs = std::filesystem;

// The first line of a small sysfs file, or empty (with errno's reason in `why`) when unreadable.
std::optional<std::string> read_line(const fs::path& path, std::string* why = nullptr) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) {
    if (why != nullptr) *why = std::strerror(errno != 0 ? errno : EIO);
    return std::nullopt;
  }
  return line;
}

std::optional<double> read_microjoules(const fs::path& path) {
  const std::optional<std::string> line = read_line(path);
  if (!line) return std::nullopt;
  try {
    return static_cast<double>(std::stoull(*line)) * 1e-6;
  } catch (...) {
    return std::nullopt;
  }
}

class RaplPackageSource final : public EnergySource {
 public:
  explicit RaplPackageSource(const fs::path& domain) : counter_(domain / "energy_uj") {
    name_ = "cpu " + read_line(domain / "name").value_or(domain.filename().string());
    wrap_joules_ = read_microjoules(domain / "max_energy_range_uj").value_or(0.0);
    std::string why;
    if (!read_line(counter_, &why)) {
      reason_ = "cannot read " + counter_.string() + " (" + why +
                "); many kernels let only root read it: run as root, or grant read access "
                "(sudo chmod o+r " +
                counter_.string() + ")";
    } else if (wrap_joules_ <= 0.0) {
      reason_ = "cannot read " + (domain / "max_energy_range_uj").string() +
                ", so a wrap of the counter could not be told apart";
    }
  }
  std::string name() const override { return name_; }
  std::string method() const override { return "RAPL powercap counter"; }
  Kind kind() const override { return Kind::kCounter; }
  std::string unavailable_reason() const override { return reason_; }
  std::optional<double> read() override { return read_microjoules(counter_); }
  double wrap_joules() const override { return wrap_joules_; }

 private:
  fs::path counter_;
  std::string name_, reason_;
  double wrap_joules_ = 0.0;
};

// A source that only says why there is nothing to read.
class MissingSource final : public EnergySource {
 public:
  MissingSource(std::string name, std::string reason)
      : name_(std::move(name)), reason_(std::move(reason)) {}
  std::string name() const override { return name_; }
  std::string method() const override { return "RAPL powercap counter"; }
  Kind kind() const override { return Kind::kCounter; }
  std::string unavailable_reason() const override { return reason_; }
  std::optional<double> read() override { return std::nullopt; }

 private:
  std::string name_, reason_;
};

}  // namespace

std::vector<std::unique_ptr<EnergySource>> rapl_package_sources(const std::string& root) {
  std::vector<std::unique_ptr<EnergySource>> sources;
  std::error_code error;
  std::vector<fs::path> packages;
  // Package domains are the top level ones (intel-rapl:N); intel-rapl:N:M are their parts
  // (core, uncore, dram), already inside the package's count or not a package at all.
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("intel-rapl:", 0) == 0 && name.find(':', 11) == std::string::npos)
      packages.push_back(entry.path());
  }
  std::sort(packages.begin(), packages.end());
  for (const fs::path& package : packages)
    sources.push_back(std::make_unique<RaplPackageSource>(package));
  if (sources.empty())
    sources.push_back(std::make_unique<MissingSource>(
        "cpu packages", error ? root + " cannot be read (" + error.message() +
                                    "): no powercap here (a container or a non-Linux host?)"
                              : "no RAPL package domain under " + root +
                                    " (the kernel's intel_rapl driver is not loaded, or the CPU "
                                    "has no RAPL)"));
  return sources;
}

}  // namespace layup
