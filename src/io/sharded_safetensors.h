// Safetensors checkpoints split into shards, in Hugging Face's layout, written and read with
// bounded memory.
//
// A sharded checkpoint named `<base>` (e.g. "model") is a directory holding
//   <base>-00001-of-00003.safetensors, ... (5-digit numbers), each an ordinary safetensors file;
//   <base>.safetensors.index.json: {"metadata": {"total_size": <tensor bytes>, ...},
//                                   "weight_map": {"<tensor name>": "<shard file name>", ...}}
// which is what transformers' save_pretrained(max_shard_size=...) writes and from_pretrained
// reads. The writer takes each tensor's values from a callback a chunk at a time, so a model far
// larger than host memory is written holding one chunk (64 MiB by default) and never the model.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace layup {

inline constexpr size_t kDefaultStreamChunkBytes = size_t{64} << 20;

// "<base>-00002-of-00003.safetensors" and "<base>.safetensors.index.json".
std::string shard_file_name(const std::string& base_name, size_t shard, size_t shard_count);
std::string shard_index_file_name(const std::string& base_name);

// One file of a plan: tensors [first_tensor, first_tensor + tensor_count) of the list.
struct SafetensorsShard {
  std::string file_name;
  size_t first_tensor = 0;
  size_t tensor_count = 0;
  size_t data_bytes = 0;  // the tensors' bytes; the header adds a few kB
};

// Splits the tensors, in their order, into shards of at most `max_shard_bytes` tensor bytes,
// as save_pretrained does: a tensor that would overflow the current shard starts the next one, and
// a tensor larger than the limit gets a shard of its own.
std::vector<SafetensorsShard> plan_shards(std::span<const SafetensorsTensorShape> tensors,
                                          size_t max_shard_bytes, const std::string& base_name);

// Fills `out` with elements [first, first + out.size()) of tensor `tensor_index` (row-major).
// `out` never holds more than the writer's chunk.
using TensorRangeSource =
    std::function<void(size_t tensor_index, size_t first, std::span<float> out)>;

struct ShardedWriteOptions {
  size_t max_shard_bytes = 0;
  size_t chunk_bytes = kDefaultStreamChunkBytes;
  std::map<std::string, std::string> shard_metadata;  // every shard's "__metadata__"
  // Entries of the index's "metadata" besides "total_size".
  nlohmann::ordered_json index_metadata = nlohmann::ordered_json::object();
};

// Writes the shards and then the index into `dir` (which must exist) and returns the plan. The
// files appear together (see StagedFiles in atomic_file.h): a failure, such as a full disk or an
// exception from `source`, leaves no new file under a final name and every old file as it was.
// Shard files of an earlier save that the new plan does not name are left for the caller to
// remove (remove_stale_shards).
std::vector<SafetensorsShard> write_sharded_safetensors(
    const std::string& dir, const std::string& base_name,
    std::span<const SafetensorsTensorShape> tensors, const TensorRangeSource& source,
    const ShardedWriteOptions& options);

// Writes the tensors to one safetensors file at `path`, atomically, streaming each from `source`
// through one chunk as the sharded writer does.
void write_streamed_safetensors(const std::string& path,
                                std::span<const SafetensorsTensorShape> tensors,
                                const TensorRangeSource& source,
                                const std::map<std::string, std::string>& metadata = {},
                                size_t chunk_bytes = kDefaultStreamChunkBytes);

// Removes `<base>-NNNNN-of-NNNNN.safetensors` files in `dir` whose names are not in `keep`.
void remove_stale_shards(const std::string& dir, const std::string& base_name,
                         const std::vector<std::string>& keep);

// The tensors of a checkpoint stored as one safetensors file or as shards with an index, behind
// one lookup. Opening a sharded one validates the whole set before any data is read: the index is
// JSON of the form above, names no tensor twice and only plain file names; every file it names
// exists and is a valid safetensors file; every tensor it lists is in the file it names; and no
// tensor is in two files or in a file without being listed. Errors name the file at fault.
class SafetensorsFileSet {
 public:
  static SafetensorsFileSet open_single(const std::string& path);
  static SafetensorsFileSet open_index(const std::string& index_path);

  // The file that describes the set: the single file, or the index. Errors about the set name it.
  const std::string& path() const { return path_; }

  struct Located {
    const SafetensorsTensorInfo* tensor = nullptr;
    const SafetensorsReader* file = nullptr;
  };
  // The tensor called `name` and the file holding it; both null when there is none.
  Located find(std::string_view name) const;
  // Every tensor with its file, shard by shard.
  std::vector<Located> tensors() const;
  // The index's "metadata" object (empty for a single file).
  const nlohmann::json& index_metadata() const { return index_metadata_; }
  const std::vector<SafetensorsReader>& files() const { return files_; }

 private:
  std::string path_;
  std::vector<SafetensorsReader> files_;
  std::unordered_map<std::string, Located> by_name_;
  nlohmann::json index_metadata_ = nlohmann::json::object();
};

}  // namespace layup
