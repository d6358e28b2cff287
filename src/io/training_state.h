// Everything besides the weights that a run needs to resume bit-exactly, in one file:
// training_state.safetensors.
//
// The AdamW moments are two tensors, "adamw.m" and "adamw.v", each one flat vector in the order of
// the parameter layout (padded embedding rows included). The scalars (step, data sampler RNG
// state, tokens seen, losses) and the run's options are strings in the file's "__metadata__",
// integers in decimal and floating-point values in their shortest round-trip form, so they come
// back exactly. Using safetensors keeps the file inspectable with standard tools.
//
// With a compact optimizer state kind (bf16, 8bit: docs/optimizer_state.md) the moments are kept
// as the run keeps them, bit for bit (decoding 8-bit moments and coding them again is not exact):
// one U8 tensor "adamw.coded", each span's coded moments (AdamWMoments::in_buffer's layout of the
// span, optimizer_moments_padded_bytes) one after another in layout order; sharded, one tensor
// "adamw.coded.<span index>" per span. The metadata's "optimizer_state" names the kind (a state
// without it is fp32's, as every state written before there were kinds).
//
// A state too large to hold in memory (a 13B model's moments take 104 GB) is written sharded
// instead: optimizer-0000k-of-0000n.safetensors plus optimizer.safetensors.index.json in the
// checkpoint directory, in Hugging Face's sharded layout (sharded_safetensors.h). There each
// parameter tensor's moments are two tensors, "adamw.m.<name>" and "adamw.v.<name>" (layup's shape,
// padded embedding rows included), and the scalars are strings in the index's "metadata", the
// same entries as the single file's. Both are read and written through callbacks a chunk at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/run_choices.h"
#include "io/sharded_safetensors.h"
#include "model/parameter_layout.h"

namespace layup {

inline constexpr const char* kTrainingStateFileName = "training_state.safetensors";
inline constexpr const char* kOptimizerShardBaseName = "optimizer";

// The run's counters and options: everything in a training state but the moments.
struct TrainingProgress {
  int64_t step = 0;             // optimizer steps taken (AdamW's bias correction uses it)
  uint64_t data_rng_state = 0;  // BatchSampler::state() after the last batch drawn
  int64_t tokens_seen = 0;
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();  // NaN: not measured yet
  double best_val_loss = std::numeric_limits<double>::quiet_NaN();
  nlohmann::json options = nlohmann::json::object();  // the run's settings, as the trainer sees fit
  // How the moments are kept (ReadMoments and WriteMoments move AdamMoment::kCoded bytes where
  // it is not fp32).
  OptimizerStateKind optimizer_state = OptimizerStateKind::kFp32;
};

struct TrainingState : TrainingProgress {
  std::vector<float> adam_m;  // first moments, layout.total_count() floats
  std::vector<float> adam_v;  // second moments, layout.total_count() floats
};

// Writes the state to `path` atomically. The moments must have layout.total_count() floats.
void save_training_state(const std::string& path, const ParameterLayout& layout,
                         const TrainingState& state);

// Reads and validates a training state for a model of `layout`: format tag, every scalar, the
// options JSON, moment lengths equal to layout.total_count() (an error names both numbers), and
// moments AdamW can produce: finite, the second ones not negative (an error names the first
// offending index, its parameter and value).
TrainingState load_training_state(const std::string& path, const ParameterLayout& layout);

// AdamW's m and v; or, in a compact kind, both coded: `offset` and `count` are then bytes of the
// spans' coded moments one after another (coded_moments_offsets), each byte a float of its value.
enum class AdamMoment { kFirst, kSecond, kCoded };

// Where each span's coded moments start in `kind` (optimizer_moments_padded_bytes each, in layout
// order), and one more entry: their total.
std::vector<size_t> coded_moments_offsets(const ParameterLayout& layout, OptimizerStateKind kind);

// Reads `count` values of `moment` from flat layout offset `offset` on into `out`; `count` never
// exceeds the stream's chunk.
using ReadMoments = std::function<void(AdamMoment moment, size_t offset, size_t count, float* out)>;
// Takes `count` values of `moment` from flat layout offset `offset` on; the same bound.
using WriteMoments =
    std::function<void(AdamMoment moment, size_t offset, size_t count, const float* in)>;

// The sharded state's tensors, in the order they are written: "adamw.m.<name>" and
// "adamw.v.<name>" of each parameter tensor, in layup's shape.
std::vector<SafetensorsTensorShape> moment_tensor_shapes(const ParameterLayout& layout);

// Writes the sharded state into `dir` (created if needed): shards of at most `max_shard_bytes`
// tensor bytes (a larger tensor alone in one) and the index, which always exists, even for one
// shard. Memory held: one chunk. The files appear together (a failure leaves the old ones as they
// were); afterwards the optimizer files of an earlier save in `dir` that the new one does not use
// (other shards, training_state.safetensors) are removed.
void save_training_state_sharded(const std::string& dir, const ParameterLayout& layout,
                                 const TrainingProgress& progress, const ReadMoments& read_moments,
                                 size_t max_shard_bytes,
                                 size_t chunk_bytes = kDefaultStreamChunkBytes);

// Writes the state into checkpoint directory `dir` as one training_state.safetensors when the
// moments fit one shard of `max_shard_bytes` (as save_pretrained keeps a small model in one file),
// else sharded as save_training_state_sharded does. The moments come from `read_moments` a chunk
// at a time either way; a chunk of the single file may span several parameter tensors.
void save_training_state_streamed(const std::string& dir, const ParameterLayout& layout,
                                  const TrainingProgress& progress, const ReadMoments& read_moments,
                                  size_t max_shard_bytes,
                                  size_t chunk_bytes = kDefaultStreamChunkBytes);

// Whether `dir` holds optimizer.safetensors.index.json.
bool has_sharded_training_state(const std::string& dir);

// The counters and options of a training state without its moments: the single file's metadata
// or the sharded index's (`path` names either), validated as the loaders validate them.
TrainingProgress read_training_progress(const std::string& path);

// load_training_state without the moments in memory: the single file validated the same way, its
// moments written to `write_moments` in the order load_training_state_sharded writes them (each
// parameter tensor's m, then its v), a chunk at a time.
TrainingProgress load_training_state_streamed(const std::string& path,
                                              const ParameterLayout& layout,
                                              const WriteMoments& write_moments,
                                              size_t chunk_bytes = kDefaultStreamChunkBytes);

// Reads a sharded state of a model of `layout`, validated as load_training_state validates the
// single file (plus the index against its shards, see SafetensorsFileSet), and writes the moments
// to `write_moments` tensor by tensor (m, then v, of each), each element of both exactly once.
// Every tensor's presence and shape is checked before the first write; a value no AdamW run can
// produce is found while streaming, so after that error part of the caller's memory is written.
TrainingProgress load_training_state_sharded(const std::string& dir, const ParameterLayout& layout,
                                             const WriteMoments& write_moments,
                                             size_t chunk_bytes = kDefaultStreamChunkBytes);

}  // namespace layup
