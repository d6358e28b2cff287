// A placement plan in a file: what `layup study` recommends, and what `layup train --plan FILE`
// and `layup bench --plan FILE` read back.
//
// The file is JSON. What a run applies is `place`, the --place CLASS=KIND flags of the plan (every
// class the study moved from its default), read into typed overrides as the file is read; the
// rest records where the plan was measured, so a reader can tell a plan made for another device
// or model. A run's own --place flags come after the plan's and win.
#pragma once

#include <string>
#include <vector>

#include "memory/place_override.h"

namespace layup {

constexpr const char* kPlanFileFormat = "layup-placement-plan";
constexpr int kPlanFileVersion = 1;

struct PlanFile {
  std::vector<PlaceOverride> place;  // in order; written as CLASS=KIND
  // Where it was measured, for the reader: the mode, model, B x T, device and the placement in
  // full (Placement::describe()), and the median step time it gave.
  std::string mode, model, device_name, placement;
  int batch = 0, seq_len = 0;
  double median_ms = 0.0;
};

void write_plan_file(const std::string& path, const PlanFile& plan);
// Throws layup::Error naming the file when it cannot be read, is not JSON, is not a plan file, is
// of a later version or holds a placement that is not CLASS=KIND.
PlanFile read_plan_file(const std::string& path);

// The --place overrides of a run given --plan `plan_path` (empty: no plan) and its own --place
// flags: the plan's first, so that the run's own override them.
std::vector<PlaceOverride> place_flags_with_plan(const std::string& plan_path,
                                                 const std::vector<PlaceOverride>& place);

}  // namespace layup
