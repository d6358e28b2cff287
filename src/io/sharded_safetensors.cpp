// Sharded safetensors: planning shards, streaming them out through a chunk, reading an index.
#include "io/sharded_safetensors.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/error.h"

namespace layup {
namespace fs = std::filesystem;
namespace {

constexpr const char* kShardSuffix = ".safetensors";

size_t element_count(const std::vector<size_t>& shape) {
  size_t count = 1;
  for (size_t dim : shape) count *= dim;
  return count;
}

bool all_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(c) != 0; });
}

// "<base>-NNNNN-of-NNNNN.safetensors", as shard_file_name writes it (more digits past 99999).
bool is_shard_file_name(std::string_view name, const std::string& base_name) {
  const std::string prefix = base_name + "-";
  const std::string_view suffix = kShardSuffix;
  if (!name.starts_with(prefix) || !name.ends_with(suffix) ||
      name.size() < prefix.size() + suffix.size()) {
    return false;
  }
  const std::string_view middle =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  const size_t of = middle.find("-of-");
  if (of == std::string_view::npos) return false;
  const std::string_view shard = middle.substr(0, of), count = middle.substr(of + 4);
  return shard.size() >= 5 && count.size() >= 5 && all_digits(shard) && all_digits(count);
}

// A weight_map value must name a file beside the index: no directories, nothing outside it.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Parses the index, reporting the first tensor name its weight_map lists twice: JSON parsers keep
// one of two equal keys silently, which would hide two saves mixed into one index.
nlohmann::json parse_index(const std::string& index_path, std::string& listed_twice) {
  const std::vector<std::byte> bytes = read_file_bytes(index_path);
  std::string top_key;
  std::set<std::string> seen;
  // Keys of the top-level object arrive at depth 1, keys of the objects inside it at depth 2.
  const nlohmann::json::parser_callback_t note_duplicates =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event != nlohmann::json::parse_event_t::key) return true;
        if (depth == 1) {
          top_key = parsed.get<std::string>();
        } else if (depth == 2 && top_key == "weight_map" && listed_twice.empty() &&
                   !seen.insert(parsed.get<std::string>()).second) {
          listed_twice = parsed.get<std::string>();
        }
        return true;
      };
  try {
    return nlohmann::json::parse(reinterpret_cast<const char*>(bytes.data()),
                                 reinterpret_cast<const char*>(bytes.data()) + bytes.size(),
                                 note_duplicates);
  } catch (const nlohmann::json::exception& error) {
    fail(index_path, " is not valid JSON (", error.what(), "); the index is damaged");
  }
}

// Writes tensors [first_tensor, first_tensor + count) through `append` as one safetensors file,
// each tensor asked of `source` a chunk at a time.
void append_streamed_safetensors(const AppendBytes& append, const std::string& path,
                                 std::span<const SafetensorsTensorShape> tensors,
                                 size_t first_tensor, size_t count,
                                 const std::map<std::string, std::string>& metadata,
                                 const TensorRangeSource& source, std::span<float> chunk) {
  LAYUP_CHECK(!chunk.empty(), "internal error: streaming ", path, " through an empty chunk");
  const std::string header =
      safetensors_header(path, tensors.subspan(first_tensor, count), metadata);
  append(std::as_bytes(std::span(header)));
  std::vector<uint16_t> rounded;  // a chunk's bfloat16 values
  std::vector<uint8_t> bytes;     // a chunk's bytes of a U8 tensor
  for (size_t i = first_tensor; i < first_tensor + count; ++i) {
    const size_t elements = element_count(tensors[i].shape);
    const bool bf16 = tensors[i].dtype == SafetensorsDtype::kBF16;
    for (size_t start = 0; start < elements; start += chunk.size()) {
      const std::span<float> piece = chunk.first(std::min(chunk.size(), elements - start));
      source(i, start, piece);
      if (tensors[i].dtype == SafetensorsDtype::kU8) {
        bytes.resize(piece.size());
        for (size_t k = 0; k < piece.size(); ++k) {
          LAYUP_CHECK(piece[k] >= 0.0f && piece[k] <= 255.0f && piece[k] == std::floor(piece[k]),
                      "internal error: ", piece[k], " written as a byte of tensor '",
                      tensors[i].name, "' of ", path);
          bytes[k] = static_cast<uint8_t>(piece[k]);
        }
        append(std::as_bytes(std::span<const uint8_t>(bytes)));
        continue;
      }
      if (!bf16) {
        append(std::as_bytes(piece));
        continue;
      }
      rounded.resize(piece.size());
      std::transform(piece.begin(), piece.end(), rounded.begin(), float_to_bfloat16);
      append(std::as_bytes(std::span<const uint16_t>(rounded)));
    }
  }
}

// The one buffer every byte of tensor data passes through: the chunk, or less for small tensors.
std::vector<float> chunk_buffer(std::span<const SafetensorsTensorShape> tensors,
                                size_t chunk_bytes) {
  size_t largest_tensor = 0;
  for (const SafetensorsTensorShape& tensor : tensors) {
    largest_tensor = std::max(largest_tensor, element_count(tensor.shape));
  }
  return std::vector<float>(
      std::max<size_t>(1, std::min(chunk_bytes / sizeof(float), largest_tensor)));
}

}  // namespace

std::string shard_file_name(const std::string& base_name, size_t shard, size_t shard_count) {
  char numbers[64];
  std::snprintf(numbers, sizeof(numbers), "-%05zu-of-%05zu", shard, shard_count);
  return base_name + numbers + kShardSuffix;
}

std::string shard_index_file_name(const std::string& base_name) {
  return base_name + kShardSuffix + ".index.json";
}

std::vector<SafetensorsShard> plan_shards(std::span<const SafetensorsTensorShape> tensors,
                                          size_t max_shard_bytes, const std::string& base_name) {
  LAYUP_CHECK(max_shard_bytes > 0, "the maximum shard size must be at least 1 byte");
  std::vector<SafetensorsShard> shards;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t bytes = element_count(tensors[i].shape) * dtype_bytes(tensors[i].dtype);
    // A shard holding data is closed when this tensor would overflow it; an empty one takes the
    // tensor whatever its size, which is how an oversized tensor ends up alone.
    if (shards.empty() ||
        (shards.back().data_bytes > 0 && shards.back().data_bytes + bytes > max_shard_bytes)) {
      shards.push_back({"", i, 0, 0});
    }
    shards.back().tensor_count += 1;
    shards.back().data_bytes += bytes;
  }
  for (size_t k = 0; k < shards.size(); ++k) {
    shards[k].file_name = shard_file_name(base_name, k + 1, shards.size());
  }
  return shards;
}

std::vector<SafetensorsShard> write_sharded_safetensors(
    const std::string& dir, const std::string& base_name,
    std::span<const SafetensorsTensorShape> tensors, const TensorRangeSource& source,
    const ShardedWriteOptions& options) {
  const std::string index_path = (fs::path(dir) / shard_index_file_name(base_name)).string();
  LAYUP_CHECK(!tensors.empty(), "cannot write ", index_path, ": there are no tensors to write");
  // Each shard's header checks the names in it; a name repeated in another shard would not be.
  std::set<std::string> names;
  for (const SafetensorsTensorShape& tensor : tensors) {
    LAYUP_CHECK(names.insert(tensor.name).second, "cannot write ", index_path, ": tensor '",
                tensor.name, "' appears twice");
  }
  const std::vector<SafetensorsShard> shards =
      plan_shards(tensors, options.max_shard_bytes, base_name);
  std::vector<float> chunk = chunk_buffer(tensors, options.chunk_bytes);
  StagedFiles files;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  size_t total_bytes = 0;
  for (const SafetensorsShard& shard : shards) {
    const std::string path = (fs::path(dir) / shard.file_name).string();
    files.stage(
        path,
        [&](const AppendBytes& append) {
          append_streamed_safetensors(append, path, tensors, shard.first_tensor, shard.tensor_count,
                                      options.shard_metadata, source, chunk);
        },
        FileWriteMode::kStreamed);
    for (size_t i = shard.first_tensor; i < shard.first_tensor + shard.tensor_count; ++i) {
      weight_map[tensors[i].name] = shard.file_name;
    }
    total_bytes += shard.data_bytes;
  }
  nlohmann::ordered_json metadata = {{"total_size", total_bytes}};
  for (const auto& [key, value] : options.index_metadata.items()) metadata[key] = value;
  const nlohmann::ordered_json index = {{"metadata", metadata}, {"weight_map", weight_map}};
  const std::string index_text = index.dump(2) + "\n";
  files.stage(index_path,
              [&](const AppendBytes& append) { append(std::as_bytes(std::span(index_text))); });
  // The index is renamed last, so it never names a shard that is not yet in place.
  files.commit();
  return shards;
}

void write_streamed_safetensors(const std::string& path,
                                std::span<const SafetensorsTensorShape> tensors,
                                const TensorRangeSource& source,
                                const std::map<std::string, std::string>& metadata,
                                size_t chunk_bytes) {
  std::vector<float> chunk = chunk_buffer(tensors, chunk_bytes);
  write_file_atomically(
      path,
      [&](const AppendBytes& append) {
        append_streamed_safetensors(append, path, tensors, 0, tensors.size(), metadata, source,
                                    chunk);
      },
      FileWriteMode::kStreamed);
}

void remove_stale_shards(const std::string& dir, const std::string& base_name,
                         const std::vector<std::string>& keep) {
  std::error_code error;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_file_name(name, base_name) &&
        std::find(keep.begin(), keep.end(), name) == keep.end()) {
      stale.push_back(entry.path());
    }
  }
  LAYUP_CHECK(!error, "cannot list ", dir,
              " to remove shards of an earlier save: ", error.message());
  for (const fs::path& path : stale) {
    fs::remove(path, error);
    LAYUP_CHECK(!error, "cannot remove ", path.string(),
                ", a shard of an earlier save: ", error.message());
  }
}

SafetensorsFileSet SafetensorsFileSet::open_single(const std::string& path) {
  SafetensorsFileSet set;
  set.path_ = path;
  set.files_.emplace_back(path);
  for (const SafetensorsTensorInfo& tensor : set.files_.front().tensors()) {
    set.by_name_[tensor.name] = {&tensor, &set.files_.front()};
  }
  return set;
}

SafetensorsFileSet SafetensorsFileSet::open_index(const std::string& index_path) {
  SafetensorsFileSet set;
  set.path_ = index_path;
  std::string listed_twice;
  const nlohmann::json index = parse_index(index_path, listed_twice);
  LAYUP_CHECK(listed_twice.empty(), index_path, " lists tensor '", listed_twice,
              "' twice in its weight_map; the index is damaged (were two saves merged?)");
  LAYUP_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              index_path,
              " has no \"weight_map\" object mapping tensor names to shard files; it is not a "
              "safetensors index or it is damaged");
  if (index.contains("metadata")) {
    LAYUP_CHECK(index["metadata"].is_object(), index_path, ": \"metadata\" is ",
                index["metadata"].type_name(), " instead of an object");
    set.index_metadata_ = index["metadata"];
  }
  const nlohmann::json& weight_map = index["weight_map"];
  LAYUP_CHECK(!weight_map.empty(), index_path, " lists no tensors in its weight_map");

  // Shard file names sort in shard order (5-digit numbers), so a std::set gives file order.
  std::set<std::string> file_names;
  for (const auto& [name, file] : weight_map.items()) {
    LAYUP_CHECK(file.is_string() && is_plain_file_name(file.get<std::string>()), index_path,
                ": tensor '", name, "' is mapped to ", file.dump(),
                ", which is not the name of a file beside the index");
    file_names.insert(file.get<std::string>());
  }
  const fs::path dir = fs::path(index_path).parent_path();
  for (const std::string& file_name : file_names) {
    const fs::path path = dir / file_name;
    std::error_code error;
    if (fs::is_regular_file(path, error)) continue;
    size_t tensors_there = 0;
    for (const auto& [name, file] : weight_map.items()) tensors_there += file == file_name;
    fail(index_path, " maps ", tensors_there, " tensors to ", file_name, ", but ", path.string(),
         " does not exist; the checkpoint is incomplete (copy the missing shard, or save the "
         "model again)");
  }

  set.files_.reserve(file_names.size());  // by_name_ points into the readers
  for (const std::string& file_name : file_names) {
    set.files_.emplace_back((dir / file_name).string());
  }
  for (const SafetensorsReader& file : set.files_) {
    for (const SafetensorsTensorInfo& tensor : file.tensors()) {
      auto [found, inserted] = set.by_name_.try_emplace(tensor.name, Located{&tensor, &file});
      LAYUP_CHECK(inserted, "tensor '", tensor.name, "' is stored twice: in ",
                  found->second.file->path(), " and in ", file.path(), " (", index_path,
                  " names one); the shards are from different saves");
    }
  }
  for (const auto& [name, file] : weight_map.items()) {
    const std::string expected = (dir / file.get<std::string>()).string();
    auto found = set.by_name_.find(name);
    LAYUP_CHECK(found != set.by_name_.end(), index_path, " lists tensor '", name, "' in ",
                file.get<std::string>(), ", but ", expected,
                " has no such tensor; the shards and the index are from different saves");
    LAYUP_CHECK(found->second.file->path() == expected, index_path, " lists tensor '", name,
                "' in ", file.get<std::string>(), ", but it is in ", found->second.file->path(),
                "; the shards and the index are from different saves");
  }
  for (const auto& [name, located] : set.by_name_) {
    LAYUP_CHECK(weight_map.contains(name), located.file->path(), " holds tensor '", name,
                "', which ", index_path,
                " does not list; the shards and the index are from different saves");
  }
  return set;
}

SafetensorsFileSet::Located SafetensorsFileSet::find(std::string_view name) const {
  auto found = by_name_.find(std::string(name));
  return found == by_name_.end() ? Located{} : found->second;
}

std::vector<SafetensorsFileSet::Located> SafetensorsFileSet::tensors() const {
  std::vector<Located> all;
  for (const SafetensorsReader& file : files_) {
    for (const SafetensorsTensorInfo& tensor : file.tensors()) all.push_back({&tensor, &file});
  }
  return all;
}

}  // namespace layup
