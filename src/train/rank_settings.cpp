// The settings the ranks of a run compare; see rank_settings.h.
//
// Left out on purpose, because they may differ from rank to rank: --threads and --cpu-workers
// (how many of its machine's cores a rank uses: hosts differ, and no collective's shape depends
// on them), --out, --overwrite, --trace, --json and --calibration (rank 0 alone writes them),
// --offload-dir (a path on each rank's own machine), and --energy (each rank reads its own
// meters, and only rank 0 reports them).
#include "train/rank_settings.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/hf_config.h"
#include "train/run_info.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

std::string clip_text(float clip) {
  return clip > 0.0f ? setting_text(clip) : "none";
}

std::string build() {
  return layup_version() + " (commit " + git_commit() + ")";
}

// The rest of the model's shape, as config.json keeps it (the Llama family's head counts, MLP
// width, rope): models of the same flags but other files (--init-from) differ here.
void add_model_config(std::vector<SharedSetting>& settings, const ModelConfig& model) {
  const nlohmann::ordered_json config = hf_config_json(model);
  for (const auto& [key, value] : config.items())
    settings.push_back({"the model's " + key, setting_text(value)});
}

// A budget as the ranks compare it: its bytes ("16G" and "16GiB" agree), empty for none.
std::string budget_text(const std::optional<size_t>& bytes) {
  return bytes ? std::to_string(*bytes) + " bytes" : std::string();
}

// RunSpec's flags that neither table nor command lists elsewhere.
void add_placement_flags(std::vector<SharedSetting>& settings, const RunSpec& spec) {
  std::string place;
  for (const PlaceOverride& item : spec.place) {
    if (!place.empty()) place += ',';
    place += item.name();
  }
  settings.insert(settings.end(), {{"--device", name_of(spec.device)},
                                   {"--dtype", name_of(spec.dtype)},
                                   {"--attention", name_of(spec.attention)},
                                   {"--optimizer-placement", spec.optimizer_placement.name()},
                                   {"--streamed-blocks", spec.streamed_blocks.name()},
                                   {"--memory-budget", budget_text(spec.memory_budget)},
                                   {"--device-budget", budget_text(spec.device_budget)},
                                   {"--host-budget", budget_text(spec.host_budget)},
                                   {"--allow-overcommit", spec.allow_overcommit ? "true" : "false"},
                                   {"--place", place}});
}

// "step-00000040" for .../run/step-00000040 (or .../step-00000040/); "" for none.
std::string checkpoint_name(const std::string& checkpoint) {
  const fs::path path = fs::path(checkpoint).lexically_normal();
  return (path.has_filename() ? path : path.parent_path()).filename().string();
}

// 64-bit FNV-1a: a digest of names and sizes, not a cryptographic one.
uint64_t fnv1a(uint64_t hash, const std::string& bytes) {
  for (const unsigned char byte : bytes) hash = (hash ^ byte) * 0x100000001b3ULL;
  return hash;
}

}  // namespace

std::string describe_shards(const DataFolderShards& shards) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  uintmax_t bytes = 0;
  for (const std::vector<std::string>* split : {&shards.train, &shards.val})
    for (const std::string& path : *split) {
      std::error_code error;
      const uintmax_t size = fs::file_size(path, error);
      LAYUP_CHECK(!error, "cannot read the size of the token shard ", path, ": ", error.message());
      bytes += size;
      hash = fnv1a(hash, fs::path(path).filename().string() + '\0' + std::to_string(size) + '\0');
    }
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(hash));
  return std::to_string(shards.train.size()) + " train and " + std::to_string(shards.val.size()) +
         " validation shards, " + std::to_string(bytes) + " bytes (names and sizes " + digest + ")";
}

std::vector<SharedSetting> train_settings_ranks_share(const TrainOptions& options,
                                                      const std::string& checkpoint) {
  // Whether and where a run starts first: a rank that resumes differs from one that does not in
  // most settings below, and this names the cause. A checkpoint by its folder's name, which says
  // its step: hosts may keep their copies at other paths.
  std::vector<SharedSetting> settings = {{"layup", build()},
                                         {"--resume", checkpoint_name(checkpoint)},
                                         {"--init-from", options.init_from}};
  // The settings a checkpoint keeps, the model's shape first: what a rank reads the wrong count of
  // blocks, steps or bytes by.
  for (const NamedSetting& setting : run_settings_in_order(options))
    settings.push_back({setting.flag.empty() ? "the model's " + setting.key : setting.flag,
                        setting.key == "clip" ? clip_text(setting.value.get<float>())
                                              : setting_text(setting.value)});
  add_placement_flags(settings, options);
  add_model_config(settings, options.model);
  // Every rank stops after the same step and takes part in the same checkpoints.
  settings.insert(
      settings.end(),
      {{"--until-step", options.until_step > 0 ? std::to_string(options.until_step) : ""},
       {"--no-checkpoints", options.checkpoints ? "false" : "true"}});
  return settings;
}

std::vector<SharedSetting> bench_settings_ranks_share(const BenchmarkOptions& options) {
  const ModelConfig& model = options.model;
  std::vector<SharedSetting> settings = {{"layup", build()},
                                         {"--model", options.model_name},
                                         {"--layers", std::to_string(model.n_layer)},
                                         {"--heads", std::to_string(model.n_head)},
                                         {"--dim", std::to_string(model.n_embd)},
                                         {"--context", std::to_string(model.n_positions)},
                                         {"--batch", std::to_string(options.batch)},
                                         {"--seq-len", std::to_string(options.seq_len)},
                                         {"--grad-accum", std::to_string(options.grad_accum)},
                                         {"--warmup", std::to_string(options.warmup_steps)},
                                         {"--steps", std::to_string(options.steps)},
                                         {"--seed", std::to_string(options.seed)},
                                         {"--mode", name_of(options.mode)},
                                         {"--clip", clip_text(options.clip)},
                                         {"--layup-clip", name_of(options.layup_clip)},
                                         {"--layup-head", name_of(options.layup_head)},
                                         {"--optimizer-state", name_of(options.optimizer_state)},
                                         {"--accumulate", name_of(options.accumulation)},
                                         {"--recompute", std::to_string(options.recompute)},
                                         {"--algorithms", name_of(options.algorithms)}};
  add_placement_flags(settings, options);
  add_model_config(settings, model);
  return settings;
}

}  // namespace layup
