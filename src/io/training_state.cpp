// Saving and loading the optimizer moments and the run's counters as one safetensors file.
#include "io/training_state.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>
#include <span>
#include <system_error>

#include "core/error.h"
#include "io/safetensors.h"

namespace layup {
namespace {

constexpr const char* kFormatTag = "layup-training-state";
// A shard of a sharded state: its tensors, with the scalars in the index.
constexpr const char* kShardFormatTag = "layup-training-state-shard";
constexpr const char* kFormatVersion = "1";
constexpr const char* kMomentM = "adamw.m";
constexpr const char* kMomentV = "adamw.v";
constexpr const char* kCodedMoments = "adamw.coded";

template <class Number>
std::string number_text(Number value) {
  char text[64];
  auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end);
}

using Metadata = std::map<std::string, std::string>;

const std::string& metadata_entry(const Metadata& metadata, const std::string& path,
                                  const std::string& key) {
  auto found = metadata.find(key);
  LAYUP_CHECK(found != metadata.end(), path, " has no \"", key,
              "\" entry in its metadata; the training state is damaged");
  return found->second;
}

// Parses the whole string as a number, or fails naming the entry.
template <class Number>
Number parse_metadata_number(const Metadata& metadata, const std::string& path,
                             const std::string& key) {
  const std::string text = metadata_entry(metadata, path, key);
  Number value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LAYUP_CHECK(error == std::errc() && end == text.data() + text.size() && !text.empty(), path,
              ": metadata entry \"", key, "\" is '", text,
              "', not a number of the expected kind; the training state is damaged");
  return value;
}

Metadata progress_metadata(const std::string& path, const ParameterLayout& layout,
                           const TrainingProgress& progress) {
  LAYUP_CHECK(progress.step >= 0 && progress.tokens_seen >= 0, "cannot write ", path,
              ": negative step (", progress.step, ") or tokens seen (", progress.tokens_seen, ")");
  return {
      {"format", kFormatTag},
      {"format_version", kFormatVersion},
      {"parameter_count", number_text(layout.total_count())},
      {"step", number_text(progress.step)},
      {"data_rng_state", number_text(progress.data_rng_state)},
      {"tokens_seen", number_text(progress.tokens_seen)},
      {"last_val_loss", number_text(progress.last_val_loss)},
      {"best_val_loss", number_text(progress.best_val_loss)},
      {"options", progress.options.dump()},
      {"optimizer_state", name_of(progress.optimizer_state)},
  };
}

TrainingProgress parse_progress(const Metadata& metadata, const std::string& path) {
  auto format = metadata.find("format");
  LAYUP_CHECK(format != metadata.end() && format->second == kFormatTag, path,
              " is not a layup training state (its metadata has format '",
              format == metadata.end() ? std::string("<none>") : format->second, "', expected '",
              kFormatTag, "')");
  const std::string version = metadata_entry(metadata, path, "format_version");
  LAYUP_CHECK(version == kFormatVersion, path, " has training-state format version ", version,
              "; this build of layup reads version ", kFormatVersion);

  TrainingProgress progress;
  progress.step = parse_metadata_number<int64_t>(metadata, path, "step");
  progress.data_rng_state = parse_metadata_number<uint64_t>(metadata, path, "data_rng_state");
  progress.tokens_seen = parse_metadata_number<int64_t>(metadata, path, "tokens_seen");
  progress.last_val_loss = parse_metadata_number<double>(metadata, path, "last_val_loss");
  progress.best_val_loss = parse_metadata_number<double>(metadata, path, "best_val_loss");
  LAYUP_CHECK(progress.step >= 0 && progress.tokens_seen >= 0, path, ": negative step (",
              progress.step, ") or tokens seen (", progress.tokens_seen,
              "); the training state is damaged");
  if (const auto kind = metadata.find("optimizer_state"); kind != metadata.end()) {
    try {
      progress.optimizer_state =
          parse_in(kOptimizerStateKindNames, kind->second, "optimizer state kind");
    } catch (const Error&) {
      fail(path, ": metadata entry \"optimizer_state\" is '", kind->second,
           "', which this build of layup does not know (fp32, bf16, 8bit); the training state is "
           "damaged or of a newer layup");
    }
  }
  const std::string options_text = metadata_entry(metadata, path, "options");
  try {
    progress.options = nlohmann::json::parse(options_text);
  } catch (const nlohmann::json::exception& error) {
    fail(path, ": metadata entry \"options\" is not valid JSON (", error.what(),
         "); the training state is damaged");
  }
  return progress;
}

// The moment tensor `name` of a single-file state, checked against the model.
const SafetensorsTensorInfo& find_moment(const SafetensorsReader& reader, const std::string& name,
                                         const ParameterLayout& layout) {
  const SafetensorsTensorInfo* tensor = reader.find(name);
  LAYUP_CHECK(tensor, reader.path(), " has no tensor '", name, "'; the training state is damaged");
  LAYUP_CHECK(tensor->dtype == "F32", reader.path(), ": tensor '", name, "' is ", tensor->dtype,
              "; AdamW moments must be F32 to resume exactly");
  LAYUP_CHECK(tensor->shape.size() == 1 && tensor->element_count == layout.total_count(),
              reader.path(), ": tensor '", name, "' holds ", tensor->element_count,
              " values but the model has ", layout.total_count(),
              " parameters; this training state belongs to a different model");
  return *tensor;
}

std::vector<float> read_moment(const SafetensorsReader& reader, const std::string& name,
                               const ParameterLayout& layout) {
  find_moment(reader, name, layout);
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

bool bad_first_moment(float m) {
  return !std::isfinite(m);
}
bool bad_second_moment(float v) {
  return !std::isfinite(v) || v < 0.0f;
}
constexpr const char* kWhyFirstMoment =
    "AdamW's first moments are averages of finite gradients and are never NaN or infinite";
constexpr const char* kWhySecondMoment =
    "AdamW's second moments are averages of squared finite gradients and are never negative, NaN "
    "or infinite";

// Refuses the first moment value that no AdamW run can produce. `values` hold flat layout indices
// [first, first + values.size()); `index_in_tensor` is the first one's index in tensor `name`.
void check_moment(std::span<const float> values, size_t first, AdamMoment moment,
                  const std::string& name, size_t index_in_tensor, const std::string& path,
                  const ParameterLayout& layout) {
  const bool is_first = moment == AdamMoment::kFirst;
  const auto bad =
      std::find_if(values.begin(), values.end(), is_first ? bad_first_moment : bad_second_moment);
  if (bad == values.end()) return;
  const size_t offset = static_cast<size_t>(bad - values.begin());
  fail(path, ": tensor '", name, "' holds ", *bad, " at index ", index_in_tensor + offset, " (",
       parameter_at(layout, first + offset), "); ", is_first ? kWhyFirstMoment : kWhySecondMoment,
       ", so the training state is damaged; resume from an earlier checkpoint");
}

// The sharded state's tensors: each parameter tensor's m, then its v.
struct MomentTensor {
  AdamMoment moment;
  const TensorSpec* spec;
  std::string name;
};

std::vector<MomentTensor> moment_tensors(const ParameterLayout& layout) {
  std::vector<MomentTensor> tensors;
  for (const TensorSpec& spec : layout.tensors()) {
    tensors.push_back({AdamMoment::kFirst, &spec, std::string(kMomentM) + "." + spec.name});
    tensors.push_back({AdamMoment::kSecond, &spec, std::string(kMomentV) + "." + spec.name});
  }
  return tensors;
}

// The coded state's tensors (a compact kind): one over every span, or one per span (sharded).
std::vector<SafetensorsTensorShape> coded_tensor_shapes(const ParameterLayout& layout,
                                                        OptimizerStateKind kind, bool sharded) {
  const std::vector<size_t> offsets = coded_moments_offsets(layout, kind);
  if (!sharded) return {{kCodedMoments, {offsets.back()}, SafetensorsDtype::kU8}};
  std::vector<SafetensorsTensorShape> shapes;
  for (size_t index = 0; index + 1 < offsets.size(); ++index)
    shapes.push_back({std::string(kCodedMoments) + "." + std::to_string(index),
                      {offsets[index + 1] - offsets[index]},
                      SafetensorsDtype::kU8});
  return shapes;
}

// The coded tensor `shape` names, found in `files` (or its single file) and checked against it.
void check_coded_tensor(const SafetensorsTensorInfo* tensor, const SafetensorsTensorShape& shape,
                        const std::string& path, OptimizerStateKind kind) {
  LAYUP_CHECK(tensor, path, " has no tensor '", shape.name, "' of the ", name_of(kind),
              " optimizer state its metadata names; the training state is damaged");
  LAYUP_CHECK(tensor->dtype == "U8", path, ": tensor '", shape.name, "' is ", tensor->dtype,
              "; coded optimizer state must be U8");
  LAYUP_CHECK(tensor->shape == shape.shape, path, ": tensor '", shape.name, "' holds ",
              tensor->element_count, " bytes but a model of this shape has ", shape.shape[0],
              " of ", name_of(kind),
              " moments there; this training state belongs to a different "
              "model");
}

std::string join_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// The index's metadata holds the same strings as the single file's, besides total_size.
Metadata index_metadata(const SafetensorsFileSet& files) {
  Metadata metadata;
  for (const auto& [key, value] : files.index_metadata().items()) {
    if (key == "total_size") continue;
    LAYUP_CHECK(value.is_string(), files.path(), ": metadata entry \"", key, "\" is ", value.dump(),
                " instead of a string; the training state is damaged");
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

}  // namespace

std::vector<size_t> coded_moments_offsets(const ParameterLayout& layout, OptimizerStateKind kind) {
  std::vector<size_t> offsets = {0};
  for (const Span& span : layout.spans())
    offsets.push_back(offsets.back() + optimizer_moments_padded_bytes(kind, span.count));
  return offsets;
}

void save_training_state(const std::string& path, const ParameterLayout& layout,
                         const TrainingState& state) {
  LAYUP_CHECK(state.optimizer_state == OptimizerStateKind::kFp32,
              "internal error: a whole training state holds fp32 moments");
  const size_t count = layout.total_count();
  LAYUP_CHECK(state.adam_m.size() == count && state.adam_v.size() == count, "cannot write ", path,
              ": the AdamW moments hold ", state.adam_m.size(), " and ", state.adam_v.size(),
              " values but the model has ", count, " parameters");
  const Metadata metadata = progress_metadata(path, layout, state);
  const SafetensorsTensor tensors[] = {
      {kMomentM, {count}, state.adam_m.data(), {}},
      {kMomentV, {count}, state.adam_v.data(), {}},
  };
  write_safetensors(path, tensors, metadata);
}

TrainingState load_training_state(const std::string& path, const ParameterLayout& layout) {
  const SafetensorsReader reader(path);
  TrainingState state;
  static_cast<TrainingProgress&>(state) = parse_progress(reader.metadata(), path);
  state.adam_m = read_moment(reader, kMomentM, layout);
  check_moment(state.adam_m, 0, AdamMoment::kFirst, kMomentM, 0, path, layout);
  state.adam_v = read_moment(reader, kMomentV, layout);
  check_moment(state.adam_v, 0, AdamMoment::kSecond, kMomentV, 0, path, layout);
  return state;
}

std::vector<SafetensorsTensorShape> moment_tensor_shapes(const ParameterLayout& layout) {
  std::vector<SafetensorsTensorShape> shapes;
  for (const MomentTensor& tensor : moment_tensors(layout))
    shapes.push_back({tensor.name, tensor.spec->shape});
  return shapes;
}

void save_training_state_sharded(const std::string& dir, const ParameterLayout& layout,
                                 const TrainingProgress& progress, const ReadMoments& read_moments,
                                 size_t max_shard_bytes, size_t chunk_bytes) {
  const std::string index_path = join_path(dir, shard_index_file_name(kOptimizerShardBaseName));
  ShardedWriteOptions options;
  options.max_shard_bytes = max_shard_bytes;
  options.chunk_bytes = chunk_bytes;
  options.shard_metadata = {{"format", kShardFormatTag}, {"format_version", kFormatVersion}};
  for (const auto& [key, value] : progress_metadata(index_path, layout, progress)) {
    options.index_metadata[key] = value;
  }
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  LAYUP_CHECK(!error, "cannot create the directory ", dir,
              " for the training state: ", error.message());

  const std::vector<MomentTensor> moments = moment_tensors(layout);
  const bool coded = progress.optimizer_state != OptimizerStateKind::kFp32;
  const std::vector<size_t> coded_offsets = coded_moments_offsets(layout, progress.optimizer_state);
  const std::vector<SafetensorsTensorShape> tensors =
      coded ? coded_tensor_shapes(layout, progress.optimizer_state, true)
            : moment_tensor_shapes(layout);
  const std::vector<SafetensorsShard> shards = write_sharded_safetensors(
      dir, kOptimizerShardBaseName, tensors,
      [&](size_t index, size_t first, std::span<float> out) {
        if (coded)
          read_moments(AdamMoment::kCoded, coded_offsets[index] + first, out.size(), out.data());
        else
          read_moments(moments[index].moment, moments[index].spec->offset + first, out.size(),
                       out.data());
      },
      options);

  std::vector<std::string> keep;
  for (const SafetensorsShard& shard : shards) keep.push_back(shard.file_name);
  remove_stale_shards(dir, kOptimizerShardBaseName, keep);
  std::filesystem::remove(join_path(dir, kTrainingStateFileName), error);
  LAYUP_CHECK(!error, "cannot remove the training state of an earlier save in ", dir, ": ",
              error.message());
}

void save_training_state_streamed(const std::string& dir, const ParameterLayout& layout,
                                  const TrainingProgress& progress, const ReadMoments& read_moments,
                                  size_t max_shard_bytes, size_t chunk_bytes) {
  const bool coded = progress.optimizer_state != OptimizerStateKind::kFp32;
  const std::vector<SafetensorsTensorShape> sharded =
      coded ? coded_tensor_shapes(layout, progress.optimizer_state, true)
            : moment_tensor_shapes(layout);
  if (plan_shards(sharded, max_shard_bytes, kOptimizerShardBaseName).size() > 1) {
    save_training_state_sharded(dir, layout, progress, read_moments, max_shard_bytes, chunk_bytes);
    return;
  }
  const std::string path = join_path(dir, kTrainingStateFileName);
  const size_t count = layout.total_count();
  const std::vector<SafetensorsTensorShape> flat =
      coded ? coded_tensor_shapes(layout, progress.optimizer_state, false)
            : std::vector<SafetensorsTensorShape>{{kMomentM, {count}}, {kMomentV, {count}}};
  write_streamed_safetensors(
      path, flat,
      [&](size_t index, size_t first, std::span<float> out) {
        const AdamMoment moment = coded        ? AdamMoment::kCoded
                                  : index == 0 ? AdamMoment::kFirst
                                               : AdamMoment::kSecond;
        read_moments(moment, first, out.size(), out.data());
      },
      progress_metadata(path, layout, progress), chunk_bytes);
  // A sharded save of an earlier run in `dir`: one state only, the index first.
  std::error_code error;
  std::filesystem::remove(join_path(dir, shard_index_file_name(kOptimizerShardBaseName)), error);
  LAYUP_CHECK(!error, "cannot remove the training state of an earlier save in ", dir, ": ",
              error.message());
  remove_stale_shards(dir, kOptimizerShardBaseName, {});
}

TrainingProgress read_training_progress(const std::string& path) {
  if (path.ends_with(".index.json")) {
    const SafetensorsFileSet files = SafetensorsFileSet::open_index(path);
    return parse_progress(index_metadata(files), path);
  }
  return parse_progress(SafetensorsReader(path).metadata(), path);
}

TrainingProgress load_training_state_streamed(const std::string& path,
                                              const ParameterLayout& layout,
                                              const WriteMoments& write_moments,
                                              size_t chunk_bytes) {
  const SafetensorsReader reader(path);
  const TrainingProgress progress = parse_progress(reader.metadata(), path);
  if (progress.optimizer_state != OptimizerStateKind::kFp32) {
    const SafetensorsTensorShape shape =
        coded_tensor_shapes(layout, progress.optimizer_state, false).front();
    const SafetensorsTensorInfo* tensor = reader.find(shape.name);
    check_coded_tensor(tensor, shape, path, progress.optimizer_state);
    std::vector<float> chunk(
        std::max<size_t>(1, std::min(chunk_bytes / sizeof(float), shape.shape[0])));
    for (size_t start = 0; start < shape.shape[0]; start += chunk.size()) {
      const std::span<float> piece(chunk.data(), std::min(chunk.size(), shape.shape[0] - start));
      reader.read_floats(*tensor, start, piece);
      write_moments(AdamMoment::kCoded, start, piece.size(), piece.data());
    }
    return progress;
  }
  // Copies (a few fields each): GCC 13 takes a reference returned here for one into the
  // temporary std::string argument (-Wdangling-reference).
  const SafetensorsTensorInfo m = find_moment(reader, kMomentM, layout);
  const SafetensorsTensorInfo v = find_moment(reader, kMomentV, layout);
  std::vector<float> chunk(
      std::max<size_t>(1, std::min(chunk_bytes / sizeof(float), layout.total_count())));
  for (const TensorSpec& spec : layout.tensors()) {
    for (const auto& [moment, tensor] :
         {std::pair{AdamMoment::kFirst, &m}, std::pair{AdamMoment::kSecond, &v}}) {
      for (size_t start = 0; start < spec.count; start += chunk.size()) {
        const std::span<float> piece(chunk.data(), std::min(chunk.size(), spec.count - start));
        const size_t offset = spec.offset + start;
        reader.read_floats(*tensor, offset, piece);
        check_moment(piece, offset, moment, tensor->name, offset, path, layout);
        write_moments(moment, offset, piece.size(), piece.data());
      }
    }
  }
  return progress;
}

bool has_sharded_training_state(const std::string& dir) {
  std::error_code error;
  return std::filesystem::is_regular_file(
      join_path(dir, shard_index_file_name(kOptimizerShardBaseName)), error);
}

TrainingProgress load_training_state_sharded(const std::string& dir, const ParameterLayout& layout,
                                             const WriteMoments& write_moments,
                                             size_t chunk_bytes) {
  const SafetensorsFileSet files = SafetensorsFileSet::open_index(
      join_path(dir, shard_index_file_name(kOptimizerShardBaseName)));
  const std::string& index_path = files.path();
  const Metadata metadata = index_metadata(files);
  const TrainingProgress progress = parse_progress(metadata, index_path);
  const size_t parameter_count =
      parse_metadata_number<size_t>(metadata, index_path, "parameter_count");
  LAYUP_CHECK(parameter_count == layout.total_count(), index_path, " is the state of a model of ",
              parameter_count, " parameters, but the model has ", layout.total_count(),
              "; this training state belongs to a different model");

  if (progress.optimizer_state != OptimizerStateKind::kFp32) {
    const std::vector<SafetensorsTensorShape> shapes =
        coded_tensor_shapes(layout, progress.optimizer_state, true);
    const std::vector<size_t> offsets = coded_moments_offsets(layout, progress.optimizer_state);
    for (const SafetensorsTensorShape& shape : shapes)
      check_coded_tensor(files.find(shape.name).tensor, shape, index_path,
                         progress.optimizer_state);
    LAYUP_CHECK(files.tensors().size() == shapes.size(), index_path, " lists ",
                files.tensors().size(), " tensors, but a model of this shape has ", shapes.size(),
                " of coded moments; the training state is damaged or of a different model");
    std::vector<float> chunk(
        std::max<size_t>(1, std::min(chunk_bytes / sizeof(float), offsets.back())));
    for (size_t index = 0; index < shapes.size(); ++index) {
      const SafetensorsFileSet::Located located = files.find(shapes[index].name);
      for (size_t start = 0; start < located.tensor->element_count; start += chunk.size()) {
        const std::span<float> piece(chunk.data(),
                                     std::min(chunk.size(), located.tensor->element_count - start));
        located.file->read_floats(*located.tensor, start, piece);
        write_moments(AdamMoment::kCoded, offsets[index] + start, piece.size(), piece.data());
      }
    }
    return progress;
  }
  const std::vector<MomentTensor> moments = moment_tensors(layout);
  std::vector<SafetensorsFileSet::Located> sources;
  for (const MomentTensor& moment : moments) {
    const SafetensorsFileSet::Located located = files.find(moment.name);
    LAYUP_CHECK(located.tensor, index_path, " lists no tensor '", moment.name,
                "'; the training state is damaged");
    const std::string& path = located.file->path();
    LAYUP_CHECK(located.tensor->dtype == "F32", path, ": tensor '", moment.name, "' is ",
                located.tensor->dtype, "; AdamW moments must be F32 to resume exactly");
    LAYUP_CHECK(located.tensor->shape == moment.spec->shape, path, ": tensor '", moment.name,
                "' has ", located.tensor->element_count, " values but the parameter has ",
                moment.spec->count, "; this training state belongs to a different model");
    sources.push_back(located);
  }
  LAYUP_CHECK(files.tensors().size() == moments.size(), index_path, " lists ",
              files.tensors().size(), " tensors, but a model of this shape has ", moments.size(),
              " moment tensors; the training state is damaged or of a different model");

  std::vector<float> chunk(
      std::max<size_t>(1, std::min(chunk_bytes / sizeof(float), layout.total_count())));
  for (size_t index = 0; index < moments.size(); ++index) {
    const MomentTensor& moment = moments[index];
    const SafetensorsTensorInfo& tensor = *sources[index].tensor;
    const SafetensorsReader& file = *sources[index].file;
    for (size_t start = 0; start < tensor.element_count; start += chunk.size()) {
      const std::span<float> piece(chunk.data(),
                                   std::min(chunk.size(), tensor.element_count - start));
      file.read_floats(tensor, start, piece);
      const size_t offset = moment.spec->offset + start;
      check_moment(piece, offset, moment.moment, moment.name, start, file.path(), layout);
      write_moments(moment.moment, offset, piece.size(), piece.data());
    }
  }
  return progress;
}

}  // namespace layup
