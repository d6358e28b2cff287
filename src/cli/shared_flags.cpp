// The flags several commands share (declared in cli/commands.h): one definition each, so that
// `train`, `bench`, `memory` and `study` describe them alike.
#include <omp.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend_buffers.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "memory/memory_plan.h"
#include "memory/place_override.h"
#include "optim/host_adamw.h"
#include "train/train_options.h"

namespace layup {

namespace {

// --model's value: a named config; else a Hugging Face model folder (its config.json) or a
// config.json file, read for the shape alone. A name wins over a folder of the same name in the
// working directory (./NAME reads the folder).
ModelConfig model_flag_config(const std::string& model) {
  for (const std::string& name : named_config_names())
    if (model == name) return named_config(model);
  const std::filesystem::path path(model);
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    const std::filesystem::path config_json = path / "config.json";
    LAYUP_CHECK(std::filesystem::is_regular_file(config_json, error), "--model ", model,
                " is a folder without a config.json; give a Hugging Face model folder, its "
                "config.json, or a named config");
    return read_hf_config(config_json.string());
  }
  if (std::filesystem::exists(path, error)) return read_hf_config(model);
  LAYUP_CHECK(model.find('/') == std::string::npos && !model.ends_with(".json"), "--model ", model,
              ": no such file or folder (give a Hugging Face model folder, its config.json, "
              "or a named config)");
  return named_config(model);  // refuses the unknown name, listing the known ones
}

}  // namespace

void add_model_flags(CLI::App& command, ModelFlags& flags, const std::string& default_model) {
  flags.model = default_model;
  flags.command = &command;
  std::string names;
  for (const std::string& name : named_config_names()) names += (names.empty() ? "" : ", ") + name;
  add_path_flag(command, "--model", flags.model, "name, model folder or config.json",
                "Named config (" + names +
                    "), or a Hugging Face model folder or its config.json (the shape only: "
                    "random weights)")
      ->capture_default_str();
  add_whole_flag(command, "--layers", flags.layers, at_least(1), "Explicit model: number of blocks")
      ->default_str("from --model");
  add_whole_flag(command, "--heads", flags.heads, at_least(1), "Explicit model: attention heads")
      ->default_str("from --model");
  add_whole_flag(command, "--dim", flags.dim, at_least(1), "Explicit model: width")
      ->default_str("from --model");
  add_whole_flag(command, "--context", flags.context, shown_as(at_least(1), "integer ≥ --seq-len"),
                 "Model context (positions)")
      ->default_str("from the config");
}

bool ModelFlags::any_given() const {
  for (const char* flag : {"--model", "--layers", "--heads", "--dim", "--context"})
    if (command->count(flag) > 0) return true;
  return false;
}

std::string ModelFlags::name() const {
  return command->count("--layers") > 0 ? "custom" : model;
}

ModelConfig ModelFlags::resolve(int seq_len) const {
  const bool model_given = command->count("--model") > 0;
  const bool sizes_given =
      command->count("--layers") || command->count("--heads") || command->count("--dim");
  LAYUP_CHECK(!(model_given && sizes_given),
              "give either --model or --layers/--heads/--dim, not both: --model ", model,
              " already fixes the sizes");
  ModelConfig config = model_flag_config(model);
  if (sizes_given) {
    LAYUP_CHECK(command->count("--layers") && command->count("--heads") && command->count("--dim"),
                "an explicit model needs all of --layers, --heads and --dim");
    config.n_layer = layers;
    config.n_head = heads;
    config.n_embd = dim;
  }
  if (command->count("--context")) config.n_positions = context;
  check_seq_len_fits(seq_len, config);
  return config;
}

// A size flag (parse_memory_size), read into bytes as the command line is parsed; a text it does
// not take is refused there, with its message.
CLI::Option* add_size_flag(CLI::App& command, const std::string& flag, std::optional<size_t>& bytes,
                           const std::string& description) {
  const auto refusal = [flag](std::string& text) -> std::string {
    try {
      parse_memory_size(text, flag);
      return "";
    } catch (const Error& error) {
      return error.what();
    }
  };
  return command
      .add_option_function<std::string>(
          flag, [&bytes, flag](const std::string& text) { bytes = parse_memory_size(text, flag); },
          description)
      ->check(CLI::Validator(refusal, ""))
      ->type_name("size");
}

void add_budget_flags(CLI::App& command, std::optional<size_t>& memory_budget,
                      std::optional<size_t>& device_budget, std::optional<size_t>& host_budget,
                      bool& allow_overcommit) {
  add_size_flag(command, "--memory-budget", memory_budget,
                "Refuse, before allocating, a run whose memory plan needs more than this, "
                "device and host side together, as on a unified-memory board: 16G, 512M, "
                "1.5GiB (K, M, G, T: powers of 1024; KB, MB, GB, TB: of 1000)");
  add_size_flag(command, "--device-budget", device_budget,
                "The same for the device side alone (what the device computes on)");
  add_size_flag(command, "--host-budget", host_budget,
                "The same for the host side alone (the schedule's host-side state). Every "
                "plan is also checked against what this machine's host memory can give "
                "(MemAvailable and the cgroup's limit, less a reserve): a budget can lower "
                "that limit, not raise it");
  command.add_flag("--allow-overcommit", allow_overcommit,
                   "Skip the check against this machine's host memory (and let --host-budget "
                   "exceed it), e.g. where swap will take the rest: the kernel may then end the "
                   "run");
}

void add_memory_flags(CLI::App& command, std::optional<size_t>& memory_budget,
                      std::optional<size_t>& device_budget, std::optional<size_t>& host_budget,
                      bool& allow_overcommit, std::vector<PlaceOverride>& place,
                      std::string& plan_path) {
  add_budget_flags(command, memory_budget, device_budget, host_budget, allow_overcommit);
  // Every value is checked by the validator (so a refusal names the one given) before the
  // callback parses them all into `place`.
  command
      .add_option_function<std::vector<std::string>>(
          "--place",
          [&place](const std::vector<std::string>& texts) { place = parse_place_overrides(texts); },
          "CLASS=KIND placement overrides, repeatable or comma-separated (classes: "
          "weights, master, grads, moments, activations, scratch; kinds: device, pinned, "
          "managed, pageable, host). Checked against the device (a kind it cannot use is "
          "refused, saying why) and applied: the schedules' buffers and the CUDA "
          "backend's activations and scratch go where it says")
      ->check(parsed_validator([](const std::string& text) { PlaceOverride::parse(text); }))
      ->type_name("CLASS=KIND, ...")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->delimiter(',')
      ->default_str("the device's default");
  add_path_flag(command, "--plan", plan_path, "file",
                "A placement plan file (`layup study` writes the one it recommends): its "
                "CLASS=KIND placements are applied first, then any --place");
}

void add_clip_flags(CLI::App& command, std::string& clip, LayupClip& layup_clip) {
  add_parsed_flag(
      command, "--clip", clip, "number > 0, or none",
      [](const std::string& text) { parse_clip_flag(text); },
      "Global gradient-norm clip threshold, or 'none' (layup with none and one "
      "micro-batch keeps no whole-model gradient on the host)")
      ->capture_default_str();
  add_choice_option(command, "--layup-clip", layup_clip, kLayupClipNames,
                    "How layup keeps clipping exact: speculative (update each block during "
                    "backward as if unclipped, into a second copy of the master weights and "
                    "moments; redo the blocks from the first copy on a step that is clipped), "
                    "deferred (one copy; update the blocks after backward, during the next "
                    "forward), or auto: deferred on an integrated GPU, whose one memory holds "
                    "everything, speculative elsewhere");
}

void add_layup_head_flag(CLI::App& command, LayupHead& layup_head) {
  add_choice_option(
      command, "--layup-head", layup_head, kLayupHeadNames,
      "Where layup updates the embeddings and the final norm: device (where their "
      "gradient already is; their AdamW moments take device memory), host (on the "
      "CPU with the blocks), or auto: device on a discrete GPU with the weights in its "
      "own memory, host elsewhere");
}

void add_optimizer_placement_flags(CLI::App& command, OptimizerPlacement& placement,
                                   std::string& offload_dir) {
  command
      .add_option_function<std::string>(
          "--optimizer-placement",
          [&placement](const std::string& text) { placement = OptimizerPlacement::parse(text); },
          "Where layup keeps the blocks' fp32 master weights and AdamW moments: device:K (the "
          "first K blocks on the device, updated there), disk:D (the last D blocks in a file "
          "under --offload-dir, updated by the CPU), staged:S (S of the other blocks, spread "
          "over them, kept on the host and updated by the device's AdamW through two staging "
          "slots in its memory; offload too), joined by commas, the rest on the host (updated by "
          "the CPU); host (device:0), or auto: on a discrete GPU as many blocks on the device as "
          "its memory (or --device-budget) admits, then, with --offload-dir, as few on disk as "
          "the host's memory needs; with a calibration, as many staged as the step-time model "
          "predicts fastest")
      ->type_name("auto, host, device:K, disk:D, staged:S, joined by commas")
      ->default_str("auto");
  add_path_flag(command, "--offload-dir", offload_dir, "directory",
                "layup: a directory on a local disk for the optimizer state of blocks placed "
                "on disk (one file, unlinked at once, removed when the run ends); its free "
                "space less a reserve is the disk's budget");
}

void add_streamed_blocks_flag(CLI::App& command, StreamedBlocks& streamed) {
  command
      .add_option_function<std::string>(
          "--streamed-blocks",
          [&streamed](const std::string& text) { streamed = StreamedBlocks::parse(text); },
          "offload and layup: the last N blocks the host updates keep no compute weights on the "
          "device; each is copied into a ring of two block-sized slots before its forward and "
          "its backward (the same bits; the link carries each such block about twice a step). "
          "0 keeps every block's weights on the device; auto streams the fewest blocks that let "
          "the run fit the device's memory (or --device-budget), none where everything fits")
      ->type_name("auto, N")
      ->default_str("auto");
}

void add_optimizer_state_flag(CLI::App& command, OptimizerStateKind& kind) {
  add_choice_option(command, "--optimizer-state", kind, kOptimizerStateKindNames,
                    "How AdamW keeps its two moments: fp32 (8 bytes a parameter), bf16 (4; each "
                    "moment rounded to bfloat16) or 8bit (2.03; blockwise dynamic quantisation, "
                    "256 values a block). bf16 and 8bit are lossy (docs/optimizer_state.md); the "
                    "master weights and the update stay fp32");
}

void add_accumulate_flag(CLI::App& command, Accumulation& accumulation) {
  add_choice_option(command, "--accumulate", accumulation, kAccumulationNames,
                    "offload and layup with --grad-accum above 1: micro-batch-major (each "
                    "micro-batch's forward and backward in turn, its gradient added into the "
                    "host's fp32 sum) or layer-major (every micro-batch's forward first, keeping "
                    "its block inputs; then each block's backward of every micro-batch, summed on "
                    "the device: the host gets one gradient a block and keeps no sum; needs "
                    "--recompute 3 on CUDA); auto: layer-major on a GPU where it moves fewer "
                    "bytes over the link. The same bits either way (docs/schedules.md)");
}

WholeRange recompute_range() {
  std::string levels;
  for (int level = 0; level <= kMaxRecompute; ++level)
    levels += (level ? ", " : "") + std::to_string(level);
  return shown_as(from_to(0, kMaxRecompute), levels);
}

void add_batch_flags(CLI::App& command, int& batch, int& seq_len) {
  add_whole_flag(command, "--batch", batch, at_least(1), "Sequences per micro-batch (B)")
      ->capture_default_str();
  add_whole_flag(command, "--seq-len", seq_len, at_least(1), "Tokens per sequence (T)")
      ->capture_default_str();
}

void add_seed_flag(CLI::App& command, uint64_t& seed, const std::string& description) {
  add_whole_flag(command, "--seed", seed,
                 shown_as(from_to(0, std::numeric_limits<uint64_t>::max()), "0 .. 2^64-1"),
                 description)
      ->capture_default_str();
}

WholeRange cores_range() {
  WholeRange range = from_to(1, static_cast<uint64_t>(allowed_core_count()));
  range.shown = "1 .. cores";
  range.note = "this process may run on " + std::to_string(allowed_core_count()) + " cores";
  return range;
}

void add_threads_flag(CLI::App& command, int& threads) {
  add_whole_flag(command, "--threads", threads, cores_range(), "CPU threads")
      ->default_str("every core");
}

void apply_threads_flag(int threads) {
  if (threads != 0) omp_set_num_threads(threads);  // 0: not given, OpenMP's one per core
}

void add_schedule_flags(CLI::App& command, Mode& mode, int& cpu_workers) {
  add_choice_option(command, "--mode", mode, kModeNames,
                    "Schedule: gpu (all on the device), offload (AdamW on the CPU after backward, "
                    "no overlap) or layup (per-block AdamW on the CPU, fed through two gradient "
                    "slots, each block's update overlapping the backward of the blocks below it; "
                    "clipping stays exact, see --layup-clip). All three train identically; `train` "
                    "may resume a run in another mode");
  add_whole_flag(command, "--cpu-workers", cpu_workers, cores_range(),
                 "offload and layup: pinned CPU AdamW workers (gpu mode ignores it)")
      ->default_str("every core");
}

void add_device_flags(CLI::App& command, DeviceKind& device, Dtype& dtype) {
  add_choice_option(command, "--device", device, kDeviceNames,
                    "Where to compute: cpu, cuda, or auto (cuda where this build has it and a GPU "
                    "is usable, else cpu)");
  add_choice_option(command, "--dtype", dtype, kDtypeNames,
                    "What the backend computes in: fp32, bf16 (cuda only), or auto (bf16 on cuda, "
                    "fp32 on cpu); the master weights and AdamW are fp32 always");
}

void add_cuda_backend_flags(CLI::App& command, int& recompute, AlgorithmChoice& algorithms,
                            AttentionChoice& attention) {
  add_whole_flag(command, "--recompute", recompute, recompute_range(),
                 "CUDA backend: recompute in the backward instead of keeping from the forward: 0 "
                 "keep every activation, 1 GELU outputs, 2 also the layer norm outputs (less "
                 "activation memory, a little more compute), 3 keep only each block's input "
                 "and re-run the block's forward (least memory; about a third more matmul work)")
      ->capture_default_str();
  add_choice_option(command, "--algorithms", algorithms, kAlgorithmChoiceNames,
                    "CUDA backend: how the algorithm of each cuBLASLt matmul and cuDNN attention "
                    "is picked: heuristic (the library's first answer: the same bits in every run) "
                    "or timed (the candidates timed on the first step, the fastest kept: a faster "
                    "step, but the choice, and so the rounding, can differ between runs)");
  add_choice_option(command, "--attention", attention, kAttentionChoiceNames,
                    "CUDA backend, bf16: the attention kernel: cudnn (cuDNN's fused attention), "
                    "layup (layup's own), or auto (cuDNN where this build and machine have it); "
                    "also read from LAYUP_ATTENTION")
      ->envname("LAYUP_ATTENTION");
}

}  // namespace layup
