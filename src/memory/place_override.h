// One --place override, CLASS=KIND, as a typed value: parsed once where its text enters (the
// --place flag, a plan file, a checkpoint's run settings) and written back as that text.
#pragma once

#include <string>
#include <vector>

#include "memory/tensor_class.h"

namespace layup {

struct PlaceOverride {
  TensorClass tensor_class = TensorClass::kWeights;
  MemoryKind kind = MemoryKind::kDevice;

  // "grads=pinned", in the CLI names: how a --place flag, a plan file and a checkpoint write it.
  std::string name() const;
  // CLASS=KIND with the names or aliases of tensor_class.h ("master-weights=mapped"). Throws
  // layup::Error naming --place and what it takes.
  static PlaceOverride parse(const std::string& text);

  bool operator==(const PlaceOverride&) const = default;
};

// Each text parsed, in order (PlaceOverride::parse).
std::vector<PlaceOverride> parse_place_overrides(const std::vector<std::string>& texts);
// Each override's name, in order.
std::vector<std::string> place_override_names(const std::vector<PlaceOverride>& overrides);

}  // namespace layup
