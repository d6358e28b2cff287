// The ranks' agreement on a run's settings; see rank_agreement.h.
//
// Every collective here has the same size on every rank whatever the settings hold: a length in a
// fixed 8 bytes before the bytes it announces, and one double a rank for the verdicts. Settings
// of other shapes (or from another build) therefore cannot make the agreement itself mismatch.
#include "comm/rank_agreement.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace layup {
namespace {

constexpr double kAgrees = -1.0;

std::vector<uint8_t> encode(const std::vector<SharedSetting>& settings) {
  nlohmann::json json = nlohmann::json::array();
  for (const SharedSetting& setting : settings) json.push_back({setting.name, setting.value});
  const std::string text = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return {text.begin(), text.end()};
}

// What rank 0 sent; where it cannot be read (another build encodes otherwise), one setting that
// differs from any this build makes, so the refusal names the build.
std::vector<SharedSetting> decode(const std::vector<uint8_t>& bytes) {
  try {
    std::vector<SharedSetting> settings;
    for (const nlohmann::json& pair : nlohmann::json::parse(bytes.begin(), bytes.end()))
      settings.push_back({pair.at(0).get<std::string>(), pair.at(1).get<std::string>()});
    return settings;
  } catch (const std::exception&) {
    return {{"layup", "of another build (its settings could not be read)"}};
  }
}

// `bytes` of rank `root` on every rank: their length first, in a buffer of the same size on all.
void broadcast_bytes(Communicator& world, std::vector<uint8_t>& bytes, int root) {
  uint64_t length = bytes.size();
  std::vector<uint8_t> length_bytes(sizeof length);
  std::copy_n(reinterpret_cast<const uint8_t*>(&length), sizeof length, length_bytes.begin());
  world.broadcast(length_bytes, root);
  std::copy_n(length_bytes.begin(), sizeof length, reinterpret_cast<uint8_t*>(&length));
  bytes.resize(length);
  world.broadcast(bytes, root);
}

// A value on one line: one with control characters (a prompt's newline) or edge spaces quoted,
// escaped as JSON escapes them.
std::string shown(const std::string& value) {
  const bool plain =
      std::none_of(value.begin(), value.end(),
                   [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }) &&
      (value.empty() || (value.front() != ' ' && value.back() != ' '));
  return plain
             ? value
             : nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool is_flag(const SharedSetting& setting) {
  return setting.name.starts_with("--");
}

// "--steps 4", "no --resume" (a flag not given), "layup 0.1.0 (commit ...)".
std::string phrase(const SharedSetting& setting) {
  if (setting.value.empty())
    return is_flag(setting) ? "no " + setting.name : setting.name + " (none)";
  return setting.name + " " + shown(setting.value);
}

}  // namespace

std::optional<size_t> first_difference(const std::vector<SharedSetting>& leaders,
                                       const std::vector<SharedSetting>& mine) {
  const size_t common = std::min(leaders.size(), mine.size());
  for (size_t i = 0; i < common; ++i)
    if (leaders[i] != mine[i]) return i;
  if (leaders.size() != mine.size()) return common;
  return std::nullopt;
}

std::string disagreement_message(int rank, const SharedSetting& mine,
                                 const SharedSetting& leaders) {
  const bool flag = is_flag(mine) || is_flag(leaders);
  return "rank " + std::to_string(rank) + (flag ? " was given " : " has ") + phrase(mine) +
         " but rank 0 " + phrase(leaders) +
         (flag ? ": every rank of an mpirun must get the same flags"
               : ": every rank of an mpirun must run the same layup build on the same files");
}

void check_ranks_agree(Communicator& world, const std::vector<SharedSetting>& settings) {
  if (world.size() == 1) return;
  std::vector<uint8_t> bytes = world.rank() == 0 ? encode(settings) : std::vector<uint8_t>();
  broadcast_bytes(world, bytes, 0);
  const std::vector<SharedSetting> leaders = world.rank() == 0 ? settings : decode(bytes);
  const std::optional<size_t> differs = first_difference(leaders, settings);
  const std::vector<double> verdicts =
      world.gather(differs ? static_cast<double>(*differs) : kAgrees);
  const auto first = std::find_if(verdicts.begin(), verdicts.end(),
                                  [](double verdict) { return verdict != kAgrees; });
  if (first == verdicts.end()) return;
  // Only the differing rank knows its own value: it tells the others, who all know rank 0's.
  const int rank = static_cast<int>(first - verdicts.begin());
  const size_t index = static_cast<size_t>(*first);
  // A setting only one side has (one list is longer) is named by the side that has it.
  const SharedSetting none;
  std::vector<uint8_t> theirs = world.rank() == rank
                                    ? encode({index < settings.size() ? settings[index] : none})
                                    : std::vector<uint8_t>();
  broadcast_bytes(world, theirs, rank);
  std::vector<SharedSetting> decoded = decode(theirs);
  SharedSetting mine = decoded.empty() ? none : decoded.front();
  SharedSetting leader = index < leaders.size() ? leaders[index] : none;
  if (mine.name.empty()) mine.name = leader.name;
  if (leader.name.empty()) leader.name = mine.name;
  fail(disagreement_message(rank, mine, leader));
}

}  // namespace layup
