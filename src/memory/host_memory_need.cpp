// Side commands' host memory against this machine's limit (host_memory_need.h).
#include "memory/host_memory_need.h"

#include <sstream>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

void check_host_memory_need(size_t bytes, const HostMemoryLimit& machine, const std::string& what,
                            const std::string& fix) {
  LAYUP_CHECK(bytes <= machine.usable_bytes(), what, " needs ", format_bytes(bytes),
              " of host memory, but this machine can give ", machine.describe(), "; ", fix);
}

std::string format_flag_value(double value) {
  std::ostringstream text;
  text.precision(10);
  text << value;
  return text.str();
}

size_t largest_fitting(size_t usable_bytes, size_t fixed_bytes, size_t bytes_per_unit) {
  if (bytes_per_unit == 0 || usable_bytes <= fixed_bytes) return 0;
  return (usable_bytes - fixed_bytes) / bytes_per_unit;
}

}  // namespace layup
