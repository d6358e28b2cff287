// The phases of `layup train` before its first step (train_setup.h).
#include "train/train_setup.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "data/token_flags.h"
#include "engine/backend_factory.h"
#include "engine/calibration.h"
#include "memory/memory_plan.h"
#include "model/parameter_layout.h"
#include "tier/disk_space.h"
#include "tier/output_file.h"
#include "trace/trace_recorder.h"
#include "train/rank_settings.h"
#include "train/schedule_checkpoint.h"
#include "train/stop_signals.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

std::string timestamped_run_dir() {
  const std::time_t now = std::time(nullptr);
  char name[64];
  std::strftime(name, sizeof name, "runs/train-%Y%m%d-%H%M%S", std::localtime(&now));
  return name;
}

// A run folder belongs to one run: what another run left there (checkpoints, its log).
std::vector<fs::path> other_runs_files(const std::string& dir) {
  std::vector<fs::path> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return found;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "log.jsonl" || name.starts_with("step-")) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The run folder, checked before anything is loaded: it must be a folder (or not exist yet), and
// hold no other run's files unless --overwrite.
void check_run_folder(const TrainOptions& options, bool continues_this_folder) {
  std::error_code error;
  const fs::path out(options.out_dir);
  LAYUP_CHECK(!fs::exists(out, error) || fs::is_directory(out, error), "--out ", options.out_dir,
              " names a file, not a folder; give a folder for the run's checkpoints and log");
  if (continues_this_folder || options.overwrite) return;
  const std::vector<fs::path> found = other_runs_files(options.out_dir);
  if (found.empty()) return;
  fail("the run folder ", options.out_dir, " already holds another run (",
       found.back().filename().string(), found.size() > 1 ? " and more" : "",
       "); continue that run with `layup train --resume ", options.out_dir,
       "`, choose another --out, or add --overwrite to replace it");
}

// The bytes the training and validation tokens take in memory once read: their shards' sizes,
// and their flags files' (instruction data, one byte a token) where there are some.
size_t token_shard_bytes(const DataFolderShards& shards) {
  size_t bytes = 0;
  for (const std::vector<std::string>* paths : {&shards.train, &shards.val})
    for (const std::string& path : *paths) {
      std::error_code error;
      const uintmax_t size = fs::file_size(path, error);
      LAYUP_CHECK(!error, "cannot read the size of the token shard ", path, ": ", error.message());
      bytes += size;
      const uintmax_t flags_size = fs::file_size(token_flags_path(path), error);
      if (!error) bytes += flags_size;
    }
  return bytes;
}

void check_tokenizer_fits_model(const TrainingData& data, const ModelConfig& model) {
  LAYUP_CHECK(data.tokenizer->vocab_size() <= model.vocab_size, "the tokenizer in ",
              data.tokenizer_dir, " has ", data.tokenizer->vocab_size(),
              " tokens but the model's vocabulary ", model.vocab_size,
              "; give --tokenizer the model's own tokenizer (or a model with a larger "
              "vocab_size)");
}

size_t checkpoint_shard_bytes(const TrainOptions& options) {
  return static_cast<size_t>(options.checkpoint_shard_mb) * 1000 * 1000;
}

}  // namespace

void make_paths_absolute(TrainOptions& options) {
  if (!options.data_dir.empty()) options.data_dir = fs::absolute(options.data_dir).string();
  if (!options.init_from.empty()) {
    options.init_from = fs::absolute(options.init_from).string();
    // A model folder from the hub carries its tokenizer: the data and the sample use it.
    if (options.tokenizer_dir.empty() && fs::exists(fs::path(options.init_from) / "tokenizer.json"))
      options.tokenizer_dir = options.init_from;
  }
  if (!options.tokenizer_dir.empty())
    options.tokenizer_dir = fs::absolute(options.tokenizer_dir).string();
}

ResumePoint find_resume_point(TrainOptions& options) {
  ResumePoint resume;
  if (options.resume.empty()) return resume;
  // The weights and moments are read once the schedule exists, span by span into it.
  resume.checkpoint = read_checkpoint_info(options.resume);
  resume.from = resume.checkpoint.path;
  LAYUP_CHECK(resume.checkpoint.has_training_state, "checkpoint '", resume.from,
              "' holds the weights only (no training_state.safetensors or "
              "optimizer.safetensors.index.json), so it cannot be resumed; it can still be "
              "used with `layup sample`");
  check_resumable_shape(resume.checkpoint);
  const TrainingProgress& progress = resume.checkpoint.progress;
  options.model = resume.checkpoint.config;
  options = resume_settings(std::move(options), progress.options, resume.from, resume.notes);
  LAYUP_CHECK(options.steps > progress.step, "the checkpoint ", resume.from, " is at step ",
              progress.step, " and the run has ", options.steps,
              " steps: it is finished; give a larger --steps to train on");
  LAYUP_CHECK(options.until_step == -1 || options.until_step > progress.step, "--until-step ",
              options.until_step, " is not after the checkpoint's step ", progress.step);
  const std::string run_folder = fs::path(resume.from).parent_path().string();
  if (options.out_dir.empty()) options.out_dir = run_folder;
  std::error_code error;
  resume.continues_this_folder = fs::equivalent(options.out_dir, run_folder, error);
  resume.step = static_cast<int>(progress.step);
  return resume;
}

void choose_save_dtype(TrainOptions& options) {
  const std::vector<std::string>& given = options.given_flags;
  if (std::find(given.begin(), given.end(), "--save-dtype") != given.end() ||
      !options.resume.empty() || options.init_from.empty())
    return;
  options.save_dtype = hf_weights_dtype(options.init_from);
}

HfFolderExtras read_checkpoint_extras(const TrainOptions& options, const ResumePoint& resume) {
  HfFolderExtras extras;
  extras.dtype = options.save_dtype;
  // The folder the run's weights came from: its config.json's ids, its generation_config.json.
  const std::string source = resume.from.empty() ? options.init_from : resume.from;
  if (!source.empty())
    extras.config = read_hf_config_extras((fs::path(source) / kHfConfigFileName).string());
  std::string tokenizer = options.tokenizer_dir.empty() ? options.init_from : options.tokenizer_dir;
  // A checkpoint carries the tokenizer as it was when the run began, whatever became of its source.
  if (!resume.from.empty() && fs::exists(fs::path(resume.from) / "tokenizer.json"))
    tokenizer = resume.from;
  extras.files = read_hf_companion_files(tokenizer, source);
  return extras;
}

RunRanks join_ranks(TrainOptions& options, const ResumePoint& resume) {
  // Data parallel (docs/parallel.md): the ranks mpirun started share each step's global batch of
  // --grad-accum micro-batches.
  RunRanks ranks;
  ranks.world = make_world_communicator();
  ranks.rank = ranks.world->rank();
  ranks.count = ranks.world->size();
  ranks.leader = ranks.rank == 0;
  // Before any collective, and before the ranks after 0 drop what rank 0 alone does: ranks given
  // other flags would run collectives of other shapes, and hang or corrupt memory.
  check_ranks_agree(*ranks.world, train_settings_ranks_share(options, resume.from));
  // One GPU a rank, before anything else touches CUDA.
  if (ranks.count > 1 && options.device != DeviceKind::kCpu)
    use_gpu_of_local_rank(ranks.world->local_rank());
  LAYUP_CHECK(options.grad_accum % ranks.count == 0, "--grad-accum ", options.grad_accum,
              " micro-batches do not split evenly over ", ranks.count,
              " ranks: give a multiple of the rank count (each rank takes --grad-accum / ranks of "
              "every step's micro-batches)");
  // Every rank takes part in a checkpoint (the optimizer state may be split across them).
  ranks.take_part_in_checkpoints = options.checkpoints;
  if (!ranks.leader) {
    options.checkpoints = false;
    options.eval_every = 0;
    options.sample_tokens = 0;
    options.trace_path.clear();
    ranks.silent.reset(std::fopen("/dev/null", "w"));
    ranks.out = ranks.silent.get();
    LAYUP_CHECK(ranks.out != nullptr, "cannot open /dev/null for rank ", ranks.rank, "'s output");
  }
  return ranks;
}

void check_run_outputs(TrainOptions& options, const ResumePoint& resume, const RunRanks& ranks) {
  if (options.out_dir.empty()) options.out_dir = timestamped_run_dir();
  // Rank 0 alone makes the run folder, so it alone checks it: another rank could find it made.
  if (ranks.leader) {
    check_run_folder(options, resume.continues_this_folder);
    // Its log at least: a folder on /proc or a read-only disk is refused here, not at the log.
    check_output_folder(options.out_dir, "--out", kSmallOutputBytes, MissingFolder::kMade);
  }
  if (!options.trace_path.empty()) {
    check_trace_path(options.trace_path);
    check_output_file(options.trace_path, "--trace",
                      trace_file_bytes_estimate(options.steps, options.model.n_layer));
  }
}

TrainingData find_training_data(const TrainOptions& options, const RunRanks& ranks) {
  TrainingData data;
  data.tokenizer_dir = options.tokenizer_dir.empty()
                           ? (fs::path(shipped_data_dir()) / "gpt2-tokenizer").string()
                           : options.tokenizer_dir;
  data.tokenizer = load_tokenizer(data.tokenizer_dir);
  // With --data the shards' own ids are checked first (when they are read), naming the shard.
  if (options.data_dir.empty()) check_tokenizer_fits_model(data, options.model);
  std::string data_dir = options.data_dir;
  if (data_dir.empty()) {
    data_dir = default_shard_dir(*data.tokenizer, data.tokenizer_dir, ranks.out);
  } else if (is_data_file(data_dir)) {
    const ExampleEncoding encoding{read_instruction_tokenizer_config(data.tokenizer_dir),
                                   options.learn};
    data_dir =
        data_file_shard_dir(*data.tokenizer, data.tokenizer_dir, data_dir, encoding, ranks.out);
  }
  data.shards = find_data_folder_shards(data_dir);
  check_ranks_agree(*ranks.world, {{"the data shards", describe_shards(data.shards)}});
  return data;
}

void read_training_data(TrainingData& data, const TrainOptions& options) {
  const int vocab_size = options.model.vocab_size;
  data.train = std::make_unique<TokenDataset>(data.shards.train, vocab_size);
  data.val = std::make_unique<TokenDataset>(data.shards.val, vocab_size);
  if (!options.data_dir.empty()) check_tokenizer_fits_model(data, options.model);
  const ExamplePacking packing =
      options.pack_examples ? ExamplePacking::kPack : ExamplePacking::kOnePerWindow;
  data.sampler = std::make_unique<BatchSampler>(*data.train, options.batch, options.seq_len,
                                                options.seed, packing);
  data.validation = std::make_unique<ValidationBatches>(*data.val, options.batch, options.seq_len,
                                                        options.eval_batches, packing);
}

void check_checkpoints_fit(const TrainOptions& options, int start_step, const MemoryPlan* plan) {
  if (!options.checkpoints) return;
  const std::string run_disk = existing_folder_of(options.out_dir);
  const size_t shard_bytes = checkpoint_shard_bytes(options);
  const auto check_fits = [&](const DiskSpace& space) {
    const int last_step = options.until_step > 0 ? options.until_step : options.steps;
    const int every = options.checkpoint_every;
    const int saves =
        every > 0 ? last_step / every - start_step / every + (last_step % every != 0) : 1;
    check_checkpoint_disk(
        checkpoint_disk_need(ParameterLayout(options.model), options.checkpoint_contents,
                             shard_bytes, saves, options.keep_checkpoints,
                             count_checkpoints(options.out_dir), options.save_dtype,
                             options.optimizer_state),
        space);
  };
  if (plan == nullptr) {
    check_fits(read_disk_space(run_disk));
    check_checkpoint_file_size_limit(ParameterLayout(options.model), options.checkpoint_contents,
                                     shard_bytes, file_size_limit_bytes());
    return;
  }
  // The disk tier's file (reserved when the schedule is built) may share their file system.
  if (plan->disk_bytes == 0 || !same_file_system(run_disk, options.offload_dir)) return;
  DiskSpace space = read_disk_space(run_disk);
  space.free_bytes -= std::min(space.free_bytes, plan->disk_bytes);
  space.dir += " (less the disk tier's " + format_bytes(plan->disk_bytes) +
               " under --offload-dir, on the same file system)";
  check_fits(space);
}

RunRequest train_run_request(const TrainOptions& options, const TrainingData& data,
                             const ResumePoint& resume, const RunRanks& ranks) {
  RunRequest request = run_request_of(options);
  request.plan.data_bytes = token_shard_bytes(data.shards);
  request.plan.streams_checkpoints = options.checkpoints || !resume.from.empty();
  request.plan.ranks = ranks.count;
  request.rates = cached_machine_rates();
  return request;
}

long long load_training_state(const TrainOptions& options, const ResumePoint& resume,
                              PreparedRun& run, BatchSampler& sampler) {
  if (!resume.from.empty()) {
    load_schedule_checkpoint(resume.checkpoint, *run.schedule);
    sampler.set_state(resume.checkpoint.progress.data_rng_state);
    return resume.checkpoint.progress.tokens_seen;
  }
  if (options.init_from.empty())
    run.initialize_fresh(options.seed);
  else
    load_schedule_weights(options.init_from, *run.schedule);
  return 0;
}

void refuse_if_stopped(const ResumePoint& resume) {
  if (const int signal = StopSignals::requested())
    fail("stopped by ", StopSignals::name(signal), " before training began: nothing was written",
         resume.from.empty() ? std::string() : "; " + resume.from + " is as it was");
}

void create_run_folder(const TrainOptions& options, const ResumePoint& resume,
                       const RunRanks& ranks) {
  if (!ranks.leader) return;
  if (options.overwrite && !resume.continues_this_folder)
    for (const fs::path& path : other_runs_files(options.out_dir)) {
      std::error_code error;
      fs::remove_all(path, error);
      LAYUP_CHECK(!error, "--overwrite: cannot remove ", path.string(), ": ", error.message());
    }
  std::error_code error;
  fs::create_directories(options.out_dir, error);
  LAYUP_CHECK(!error, "cannot create the run folder ", options.out_dir, ": ", error.message(),
              "; choose another --out");
}

}  // namespace layup
