// The CPU packages' energy from Linux powercap's RAPL counters: one source per package domain
// (<root>/intel-rapl:N, whose `name` is package-N; AMD's Zen packages appear there too), reading
// `energy_uj`, which wraps at `max_energy_range_uj`. Many kernels let only root read energy_uj;
// such a package is reported unavailable with what to do about it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "energy/energy_meter.h"

namespace layup {

constexpr const char* kPowercapRoot = "/sys/class/powercap";

// One source per package domain under `root`; where there is none, one unavailable source that
// says why (no powercap, no RAPL domain).
std::vector<std::unique_ptr<EnergySource>> rapl_package_sources(const std::string& root);

}  // namespace layup
