// The ranks of a run agree on its settings before their first collective: a rank started with
// other flags (or another build, or other data) would run collectives of other shapes, or other
// counts, and hang or corrupt memory; docs/parallel.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace layup {

// One thing every rank of a run must share: a flag ("--steps") or what the value is ("layup",
// "the data shards"), and its value as the user would read it ("4"; empty: not given).
struct SharedSetting {
  std::string name;
  std::string value;
  bool operator==(const SharedSetting&) const = default;
};

// The index of the first setting of `mine` that is not the same as `leaders`' at that index (a
// name or a value), or of the first one only one of them has; nullopt where they are the same.
std::optional<size_t> first_difference(const std::vector<SharedSetting>& leaders,
                                       const std::vector<SharedSetting>& mine);

// The refusal of rank `rank` holding `mine` where rank 0 holds `leaders`, one line: "rank 1 was
// given --steps 2 but rank 0 --steps 4: every rank of an mpirun must get the same flags".
std::string disagreement_message(int rank, const SharedSetting& mine, const SharedSetting& leaders);

// Collective, every rank with its own `settings` in the same order: rank 0's are broadcast (a
// fixed-size length, then the bytes), each rank finds its first difference, and a fixed-size
// gather tells every rank every verdict, so that all return, or all throw layup::Error naming the
// lowest differing rank and its first differing setting. No collective here depends on the
// settings' sizes agreeing; one process returns at once.
void check_ranks_agree(Communicator& world, const std::vector<SharedSetting>& settings);

}  // namespace layup
