// Saving and loading the optimizer moments and the run's counters as one safetensors file.
#include "io/training_state.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <system_error>

#include "core/error.h"
#include "io/safetensors.h"

namespace layup {
namespace {

constexpr const char* kFormatTag = "layup-training-state";
constexpr const char* kFormatVersion = "1";
constexpr const char* kMomentM = "adamw.m";
constexpr const char* kMomentV = "adamw.v";

template <class Number>
std::string number_text(Number value) {
  char text[64];
  auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end);
}

const std::string& metadata_entry(const SafetensorsReader& reader, const std::string& key) {
  auto found = reader.metadata().find(key);
  LAYUP_CHECK(found != reader.metadata().end(), reader.path(), " has no \"", key,
              "\" entry in its metadata; the training state is damaged");
  return found->second;
}

// Parses the whole string as a number, or fails naming the entry.
template <class Number>
Number parse_metadata_number(const SafetensorsReader& reader, const std::string& key) {
  const std::string text = metadata_entry(reader, key);
  Number value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LAYUP_CHECK(error == std::errc() && end == text.data() + text.size() && !text.empty(),
              reader.path(), ": metadata entry \"", key, "\" is '", text,
              "', not a number of the expected kind; the training state is damaged");
  return value;
}

std::vector<float> read_moment(const SafetensorsReader& reader, const std::string& name,
                               const ParameterLayout& layout) {
  const SafetensorsTensorInfo* tensor = reader.find(name);
  LAYUP_CHECK(tensor, reader.path(), " has no tensor '", name, "'; the training state is damaged");
  LAYUP_CHECK(tensor->dtype == "F32", reader.path(), ": tensor '", name, "' is ", tensor->dtype,
              "; AdamW moments must be F32 to resume exactly");
  LAYUP_CHECK(tensor->shape.size() == 1 && tensor->element_count == layout.total_count(),
              reader.path(), ": tensor '", name, "' holds ", tensor->element_count,
              " values but the model has ", layout.total_count(),
              " parameters; this training state belongs to a different model");
  return reader.read_floats(name);
}

// "h.0.ln_1.weight, element 3": the parameter that flat index `index` of the layout belongs to.
std::string parameter_at(const ParameterLayout& layout, size_t index) {
  for (const TensorSpec& spec : layout.tensors()) {
    if (index >= spec.offset && index < spec.offset + spec.count) {
      return spec.name + ", element " + std::to_string(index - spec.offset);
    }
  }
  return "outside every parameter";
}

// Refuses the first moment value that no AdamW run can produce: `is_bad` says which those are.
template <class IsBad>
void check_moment(const std::vector<float>& moment, const std::string& name, IsBad is_bad,
                  const std::string& why, const SafetensorsReader& reader,
                  const ParameterLayout& layout) {
  const auto bad = std::find_if(moment.begin(), moment.end(), is_bad);
  if (bad == moment.end()) return;
  const size_t index = static_cast<size_t>(bad - moment.begin());
  fail(reader.path(), ": tensor '", name, "' holds ", *bad, " at index ", index, " (",
       parameter_at(layout, index), "); ", why,
       ", so the training state is damaged; resume from an earlier checkpoint");
}

}  // namespace

void save_training_state(const std::string& path, const ParameterLayout& layout,
                         const TrainingState& state) {
  const size_t count = layout.total_count();
  LAYUP_CHECK(state.adam_m.size() == count && state.adam_v.size() == count, "cannot write ", path,
              ": the AdamW moments hold ", state.adam_m.size(), " and ", state.adam_v.size(),
              " values but the model has ", count, " parameters");
  LAYUP_CHECK(state.step >= 0 && state.tokens_seen >= 0, "cannot write ", path, ": negative step (",
              state.step, ") or tokens seen (", state.tokens_seen, ")");
  const std::map<std::string, std::string> metadata = {
      {"format", kFormatTag},
      {"format_version", kFormatVersion},
      {"parameter_count", number_text(count)},
      {"step", number_text(state.step)},
      {"data_rng_state", number_text(state.data_rng_state)},
      {"tokens_seen", number_text(state.tokens_seen)},
      {"last_val_loss", number_text(state.last_val_loss)},
      {"best_val_loss", number_text(state.best_val_loss)},
      {"options", state.options.dump()},
  };
  const SafetensorsTensor tensors[] = {
      {kMomentM, {count}, state.adam_m.data(), {}},
      {kMomentV, {count}, state.adam_v.data(), {}},
  };
  write_safetensors(path, tensors, metadata);
}

TrainingState load_training_state(const std::string& path, const ParameterLayout& layout) {
  const SafetensorsReader reader(path);
  auto format = reader.metadata().find("format");
  LAYUP_CHECK(format != reader.metadata().end() && format->second == kFormatTag, path,
              " is not a layup training state (its metadata has format '",
              format == reader.metadata().end() ? std::string("<none>") : format->second,
              "', expected '", kFormatTag, "')");
  const std::string version = metadata_entry(reader, "format_version");
  LAYUP_CHECK(version == kFormatVersion, path, " has training-state format version ", version,
              "; this build of layup reads version ", kFormatVersion);

  TrainingState state;
  state.step = parse_metadata_number<int64_t>(reader, "step");
  state.data_rng_state = parse_metadata_number<uint64_t>(reader, "data_rng_state");
  state.tokens_seen = parse_metadata_number<int64_t>(reader, "tokens_seen");
  state.last_val_loss = parse_metadata_number<double>(reader, "last_val_loss");
  state.best_val_loss = parse_metadata_number<double>(reader, "best_val_loss");
  LAYUP_CHECK(state.step >= 0 && state.tokens_seen >= 0, path, ": negative step (", state.step,
              ") or tokens seen (", state.tokens_seen, "); the training state is damaged");
  const std::string options_text = metadata_entry(reader, "options");
  try {
    state.options = nlohmann::json::parse(options_text);
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": metadata entry \"options\" is not valid JSON (", error.what(),
         "); the training state is damaged");
  }
  state.adam_m = read_moment(reader, kMomentM, layout);
  check_moment(
      state.adam_m, kMomentM, [](float m) { return !std::isfinite(m); },
      "AdamW's first moments are averages of finite gradients and are never NaN or infinite",
      reader, layout);
  state.adam_v = read_moment(reader, kMomentV, layout);
  check_moment(
      state.adam_v, kMomentV, [](float v) { return !std::isfinite(v) || v < 0.0f; },
      "AdamW's second moments are averages of squared finite gradients and are never negative, "
      "NaN or infinite",
      reader, layout);
  return state;
}

}  // namespace layup
