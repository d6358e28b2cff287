// Placement plan files; see plan_file.h.
#include "memory/plan_file.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {

void write_plan_file(const std::string& path, const PlanFile& plan) {
  const nlohmann::json json = {{"format", kPlanFileFormat},
                               {"version", kPlanFileVersion},
                               {"place", place_override_names(plan.place)},
                               {"measured",
                                {{"mode", plan.mode},
                                 {"model", plan.model},
                                 {"batch", plan.batch},
                                 {"seq_len", plan.seq_len},
                                 {"device_name", plan.device_name},
                                 {"placement", plan.placement},
                                 {"median_ms", plan.median_ms}}}};
  const std::string text = json.dump(2) + "\n";
  write_text_atomically(path, text);
}

PlanFile read_plan_file(const std::string& path) {
  const std::vector<std::byte> bytes = read_file_bytes(path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                 reinterpret_cast<const char*>(bytes.data()) + bytes.size());
  } catch (const nlohmann::json::exception& error) {
    fail("--plan ", path, " is not JSON (", error.what(), "); give a file `layup study` wrote");
  }
  LAYUP_CHECK(json.is_object() && json.value("format", "") == kPlanFileFormat, "--plan ", path,
              " is not a placement plan (no \"format\": \"", kPlanFileFormat,
              "\"); give a file `layup study` wrote");
  const int version = json.value("version", 0);
  LAYUP_CHECK(version >= 1 && version <= kPlanFileVersion, "--plan ", path, " is version ", version,
              "; this layup reads version ", kPlanFileVersion, " (a newer layup wrote it?)");
  PlanFile plan;
  std::vector<std::string> place;
  try {
    place = json.at("place").get<std::vector<std::string>>();
    const nlohmann::json& measured = json.value("measured", nlohmann::json::object());
    plan.mode = measured.value("mode", "");
    plan.model = measured.value("model", "");
    plan.batch = measured.value("batch", 0);
    plan.seq_len = measured.value("seq_len", 0);
    plan.device_name = measured.value("device_name", "");
    plan.placement = measured.value("placement", "");
    plan.median_ms = measured.value("median_ms", 0.0);
  } catch (const nlohmann::json::exception& error) {
    fail("--plan ", path, ": ", error.what(), " (expected \"place\": [\"CLASS=KIND\", ...])");
  }
  try {
    plan.place = parse_place_overrides(place);
  } catch (const Error& error) {
    fail("--plan ", path, ": ", error.what());
  }
  return plan;
}

std::vector<PlaceOverride> place_flags_with_plan(const std::string& plan_path,
                                                 const std::vector<PlaceOverride>& place) {
  if (plan_path.empty()) return place;
  std::vector<PlaceOverride> overrides = read_plan_file(plan_path).place;
  overrides.insert(overrides.end(), place.begin(), place.end());
  return overrides;
}

}  // namespace layup
