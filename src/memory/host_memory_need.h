// The host memory a side command (bench-adamw, bench-disk, calibrate) allocates, checked before it
// allocates against what this machine can give: the same limit a run's plan is checked against
// (host_memory.h), so a size that does not fit is refused naming its flag instead of the process
// being ended by the kernel's out-of-memory killer.
#pragma once

#include <cstddef>
#include <string>

#include "memory/host_memory.h"

namespace layup {

// Throws layup::Error when `machine` cannot give `bytes`: "<what> needs <bytes> of host memory,
// but this machine can give <usable> (<why>); <fix>". `what` names the command and the flag
// with its value as given; `fix` the largest value that fits (largest_fitting below).
void check_host_memory_need(size_t bytes, const HostMemoryLimit& machine, const std::string& what,
                            const std::string& fix);

// A flag's number for these messages: up to 10 significant digits, no exponent below 1e10
// ("1000000000", "0.5", "1e+15").
std::string format_flag_value(double value);

// The largest count of units of `bytes_per_unit` that `usable_bytes` holds beside `fixed_bytes`.
size_t largest_fitting(size_t usable_bytes, size_t fixed_bytes, size_t bytes_per_unit);

}  // namespace layup
