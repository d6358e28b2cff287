// --place CLASS=KIND as text and back; see place_override.h.
#include "memory/place_override.h"

#include "core/error.h"

namespace layup {

std::string PlaceOverride::name() const {
  return std::string(tensor_class_name(tensor_class)) + "=" + memory_kind_name(kind);
}

PlaceOverride PlaceOverride::parse(const std::string& text) {
  const size_t equals = text.find('=');
  LAYUP_CHECK(equals != std::string::npos && equals > 0 && equals + 1 < text.size(),
              "--place takes CLASS=KIND, e.g. --place grads=pinned (got '", text, "')");
  try {
    return {parse_tensor_class(text.substr(0, equals)), parse_memory_kind(text.substr(equals + 1))};
  } catch (const Error& error) {
    fail("--place ", text, ": ", error.what());
  }
}

std::vector<PlaceOverride> parse_place_overrides(const std::vector<std::string>& texts) {
  std::vector<PlaceOverride> overrides;
  overrides.reserve(texts.size());
  for (const std::string& text : texts) overrides.push_back(PlaceOverride::parse(text));
  return overrides;
}

std::vector<std::string> place_override_names(const std::vector<PlaceOverride>& overrides) {
  std::vector<std::string> names;
  names.reserve(overrides.size());
  for (const PlaceOverride& place : overrides) names.push_back(place.name());
  return names;
}

}  // namespace layup
