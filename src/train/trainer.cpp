// The training loop: for each update, draw micro-batches, let the schedule step, log, evaluate,
// checkpoint; at the end, print a sample.
#include "train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/token_dataset.h"
#include "engine/backend_factory.h"
#include "engine/run_composer.h"
#include "io/checkpoint.h"
#include "memory/memory_plan.h"
#include "optim/lr_schedule.h"
#include "sample/generate.h"
#include "schedule/schedule.h"
#include "tier/disk_space.h"
#include "tier/output_file.h"
#include "tokenizer/tokenizer.h"
#include "trace/trace_recorder.h"
#include "train/corpus_shards.h"
#include "train/memory_usage.h"
#include "train/progress_line.h"
#include "train/rank_settings.h"
#include "train/schedule_checkpoint.h"
#include "train/setup_progress.h"
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

std::string format_rate(double tokens_per_s) {
  char text[32];
  if (tokens_per_s >= 1e6)
    std::snprintf(text, sizeof text, "%.2fM", tokens_per_s / 1e6);
  else if (tokens_per_s >= 1e3)
    std::snprintf(text, sizeof text, "%.1fk", tokens_per_s / 1e3);
  else
    std::snprintf(text, sizeof text, "%.0f", tokens_per_s);
  return text;
}

// One JSON object per line, flushed as written, so a crashed run still leaves its log. A line
// that cannot be written (a full disk, the file size limit) stops the run: a log with holes would
// mislead.
class JsonLinesLog {
 public:
  explicit JsonLinesLog(const std::string& path) : path_(path), out_(path, std::ios::app) {
    LAYUP_CHECK(out_, "cannot open the log file '", path,
                "' for appending: ", std::strerror(errno));
    std::error_code not_regular;  // /dev/null on the other ranks
    whole_bytes_ = fs::file_size(path, not_regular);
    regular_ = !not_regular;
  }
  // Invalid UTF-8 (a sample cut between the bytes of one character: GPT-2's tokens are bytes) is
  // written as U+FFFD instead of throwing at the end of the run.
  void write(const nlohmann::json& record) {
    const std::string line =
        record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    errno = 0;
    out_ << line << std::flush;
    if (out_) {
      whole_bytes_ += line.size();
      return;
    }
    const int error = errno;
    // Part of the line may have reached the file: cut back to the last whole line, so a reader
    // (or a resumed run appending) never meets half a record.
    out_.close();
    std::error_code ignored;
    if (regular_) fs::resize_file(path_, whole_bytes_, ignored);
    fail("cannot write to the log file '", path_,
         "': ", error ? std::strerror(error) : "the write failed",
         error == EFBIG ? " (past this process's file size limit: ulimit -f)"
                        : " (is the disk full?)",
         "; the run stops here rather than leave a log with holes");
  }

 private:
  std::string path_;
  std::ofstream out_;
  uintmax_t whole_bytes_ = 0;  // the file's length up to its last whole line
  bool regular_ = false;
};

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

// The bytes the training and validation tokens take in memory once read: their shards' sizes.
size_t token_shard_bytes(const DataFolderShards& shards) {
  size_t bytes = 0;
  for (const std::vector<std::string>* paths : {&shards.train, &shards.val})
    for (const std::string& path : *paths) {
      std::error_code error;
      const uintmax_t size = fs::file_size(path, error);
      LAYUP_CHECK(!error, "cannot read the size of the token shard ", path, ": ", error.message());
      bytes += size;
    }
  return bytes;
}

float mean_validation_loss(Schedule& schedule, const ValidationBatches& val) {
  double sum = 0.0;
  TokenBatchBuffer buffer;
  for (int i = 0; i < val.size(); ++i) {
    val.get(i, buffer);
    sum += schedule.evaluate(buffer.view());
  }
  return static_cast<float>(sum / val.size());
}

}  // namespace

TrainResult train(TrainOptions options) {
  // Installed first: a SIGINT or SIGTERM during the setup (loading a large model takes minutes)
  // is then seen below, before the run folder is made, instead of ending the process midway.
  const StopSignals stop_signals;
  // Saved in checkpoints: a resume from another working folder finds them.
  if (!options.data_dir.empty()) options.data_dir = fs::absolute(options.data_dir).string();
  if (!options.init_from.empty()) {
    options.init_from = fs::absolute(options.init_from).string();
    // A model folder from the hub carries its tokenizer: the data and the sample use it.
    if (options.tokenizer_dir.empty() && fs::exists(fs::path(options.init_from) / "tokenizer.json"))
      options.tokenizer_dir = options.init_from;
  }
  if (!options.tokenizer_dir.empty())
    options.tokenizer_dir = fs::absolute(options.tokenizer_dir).string();
  // Resuming takes the model and the run's settings from the checkpoint; the command line may
  // change only what leaves the trajectory alone (resume_settings).
  CheckpointInfo resumed;
  std::string resumed_from;
  std::vector<std::string> resume_notes;
  bool continues_this_folder = false;
  if (!options.resume.empty()) {
    // The weights and moments are read once the schedule exists, span by span into it.
    resumed = read_checkpoint_info(options.resume);
    resumed_from = resumed.path;
    LAYUP_CHECK(resumed.has_training_state, "checkpoint '", resumed_from,
                "' holds the weights only (no training_state.safetensors or "
                "optimizer.safetensors.index.json), so it cannot be resumed; it can still be "
                "used with `layup sample`");
    check_resumable_shape(resumed);
    options.model = resumed.config;
    options =
        resume_settings(std::move(options), resumed.progress.options, resumed_from, resume_notes);
    LAYUP_CHECK(options.steps > resumed.progress.step, "the checkpoint ", resumed_from,
                " is at step ", resumed.progress.step, " and the run has ", options.steps,
                " steps: it is finished; give a larger --steps to train on");
    LAYUP_CHECK(options.until_step == -1 || options.until_step > resumed.progress.step,
                "--until-step ", options.until_step, " is not after the checkpoint's step ",
                resumed.progress.step);
    const std::string run_folder = fs::path(resumed_from).parent_path().string();
    if (options.out_dir.empty()) options.out_dir = run_folder;
    std::error_code error;
    continues_this_folder = fs::equivalent(options.out_dir, run_folder, error);
  }
  validate_train_options(options);
  // Data parallel (docs/parallel.md): the ranks mpirun started share each step's global batch of
  // --grad-accum micro-batches, and rank 0 alone writes the run folder, the log and checkpoints
  // and prints; the others train in step with it.
  const std::unique_ptr<Communicator> world = make_world_communicator();
  const int rank = world->rank(), ranks = world->size();
  const bool leader = rank == 0;
  // Before any collective, and before the ranks after 0 drop what rank 0 alone does: ranks given
  // other flags would run collectives of other shapes, and hang or corrupt memory.
  check_ranks_agree(*world, train_settings_ranks_share(options, resumed_from));
  // One GPU a rank, before anything else touches CUDA.
  if (ranks > 1 && options.device != DeviceKind::kCpu) use_gpu_of_local_rank(world->local_rank());
  LAYUP_CHECK(options.grad_accum % ranks == 0, "--grad-accum ", options.grad_accum,
              " micro-batches do not split evenly over ", ranks,
              " ranks: give a multiple of the rank count (each rank takes --grad-accum / ranks of "
              "every step's micro-batches)");
  LAYUP_CHECK(ranks == 1 || options.optimizer_placement.blocks_on_disk() == 0,
              "several ranks (mpirun) with blocks' state on disk (--optimizer-placement ",
              options.optimizer_placement.name(),
              ") are not supported yet: each rank would need a disk tier of its own; keep the "
              "state on the host or run one rank");
  // Every rank takes part in a checkpoint (the optimizer state may be split across them); rank 0
  // alone writes it.
  const bool run_checkpoints = options.checkpoints;
  if (!leader) {
    options.checkpoints = false;
    options.eval_every = 0;
    options.sample_tokens = 0;
    options.trace_path.clear();
  }
  // What rank 0 prints; the other ranks' lines go nowhere.
  const std::unique_ptr<FILE, int (*)(FILE*)> silent(
      leader ? nullptr : std::fopen("/dev/null", "w"), &std::fclose);
  FILE* const out = leader ? stderr : silent.get();
  LAYUP_CHECK(out != nullptr, "cannot open /dev/null for rank ", rank, "'s output");
  if (options.out_dir.empty()) options.out_dir = timestamped_run_dir();
  // Rank 0 alone makes the run folder, so it alone checks it: another rank could find it made.
  if (leader) {
    check_run_folder(options, continues_this_folder);
    // Its log at least: a folder on /proc or a read-only disk is refused here, not at the log.
    check_output_folder(options.out_dir, "--out", kSmallOutputBytes, MissingFolder::kMade);
  }
  if (!options.trace_path.empty()) {
    check_trace_path(options.trace_path);
    check_output_file(options.trace_path, "--trace",
                      trace_file_bytes_estimate(options.steps, options.model.n_layer));
  }

  // The run resolved and its memory plan checked against the budgets and this machine before
  // anything is allocated or any data read: a run that cannot fit stops here, saying what would.
  const std::string tokenizer_dir = options.tokenizer_dir.empty()
                                        ? (fs::path(shipped_data_dir()) / "gpt2-tokenizer").string()
                                        : options.tokenizer_dir;
  const std::unique_ptr<Tokenizer> tokenizer_owner = load_tokenizer(tokenizer_dir);
  const Tokenizer& tokenizer = *tokenizer_owner;
  const auto check_tokenizer_fits_model = [&] {
    LAYUP_CHECK(tokenizer.vocab_size() <= options.model.vocab_size, "the tokenizer in ",
                tokenizer_dir, " has ", tokenizer.vocab_size(),
                " tokens but the model's vocabulary ", options.model.vocab_size,
                "; give --tokenizer the model's own tokenizer (or a model with a larger "
                "vocab_size)");
  };
  // With --data the shards' own ids are checked first (when they are read), naming the shard.
  if (options.data_dir.empty()) check_tokenizer_fits_model();
  const std::string data_dir = options.data_dir.empty()
                                   ? default_shard_dir(tokenizer, tokenizer_dir, out)
                                   : options.data_dir;
  const DataFolderShards shards = find_data_folder_shards(data_dir);
  check_ranks_agree(*world, {{"the data shards", describe_shards(shards)}});
  const int start_step = resumed_from.empty() ? 0 : static_cast<int>(resumed.progress.step);
  const int last_step = options.until_step > 0 ? options.until_step : options.steps;
  const size_t shard_bytes = static_cast<size_t>(options.checkpoint_shard_mb) * 1000 * 1000;
  const std::string run_disk = existing_folder_of(options.out_dir);
  // The checkpoints' disk need against `space`, before the plan and again after it when the disk
  // tier's file (reserved when the schedule is built) shares their file system.
  const auto check_checkpoints_fit = [&](const DiskSpace& space) {
    const int every = options.checkpoint_every;
    const int saves =
        every > 0 ? last_step / every - start_step / every + (last_step % every != 0) : 1;
    check_checkpoint_disk(
        checkpoint_disk_need(ParameterLayout(options.model), options.checkpoint_contents,
                             shard_bytes, saves, options.keep_checkpoints,
                             count_checkpoints(options.out_dir)),
        space);
  };
  if (options.checkpoints) {
    check_checkpoints_fit(read_disk_space(run_disk));
    check_checkpoint_file_size_limit(ParameterLayout(options.model), options.checkpoint_contents,
                                     shard_bytes, file_size_limit_bytes());
  }
  RunRequest request = run_request_of(options);
  request.plan.data_bytes = token_shard_bytes(shards);
  request.plan.streams_checkpoints = options.checkpoints || !resumed_from.empty();
  request.plan.ranks = ranks;
  const PlannedRun planned = plan_run(request);
  const MemoryPlan& memory_plan = planned.plan;
  if (options.checkpoints && memory_plan.disk_bytes > 0 &&
      same_file_system(run_disk, options.offload_dir)) {
    DiskSpace space = read_disk_space(run_disk);
    space.free_bytes -= std::min(space.free_bytes, memory_plan.disk_bytes);
    space.dir += " (less the disk tier's " + format_bytes(memory_plan.disk_bytes) +
                 " under --offload-dir, on the same file system)";
    check_checkpoints_fit(space);
  }
  const MemoryBudgets& budgets = planned.budgets;
  options.device = planned.target.device;
  options.dtype = planned.target.dtype;
  const ModelConfig& config = options.model;
  const TokenDataset train_data(shards.train, config.vocab_size);
  const TokenDataset val_data(shards.val, config.vocab_size);
  if (!options.data_dir.empty()) check_tokenizer_fits_model();
  BatchSampler sampler(train_data, options.batch, options.seq_len, options.seed);
  const ValidationBatches val(val_data, options.batch, options.seq_len, options.eval_batches);

  // Declared before the schedule, which records into it: it must outlive the schedule.
  std::unique_ptr<TraceRecorder> trace;
  SetupProgress setup(out, memory_plan);
  setup.allocating();
  BuiltRun built = build_run(planned, world.get());
  setup.allocated();
  const std::shared_ptr<MemoryAccountant> accountant = built.accountant;
  std::unique_ptr<Schedule> schedule = std::move(built.schedule);
  const std::string schedule_description = planned.describe_schedule();
  int steps_track = 0;
  if (!options.trace_path.empty()) {
    trace = std::make_unique<TraceRecorder>();
    steps_track = trace->track("steps");
    schedule->set_trace(trace.get());
    trace->set_metadata("mode", name_of(options.mode));
    trace->set_metadata("model", options.model_name);
    trace->set_metadata("device", name_of(options.device));
    trace->set_metadata("schedule", schedule_description);
  }

  long long tokens_seen = 0;
  if (!resumed_from.empty()) {
    load_schedule_checkpoint(resumed, *schedule);
    tokens_seen = resumed.progress.tokens_seen;
    sampler.set_state(resumed.progress.data_rng_state);
  } else {
    if (options.init_from.empty()) {
      schedule->initialize_fresh(options.seed, setup.initializing(parameter_count(config)));
      setup.initialized();
    } else {
      load_schedule_weights(options.init_from, *schedule);
    }
  }

  const LrSchedule lr_schedule{options.lr, options.min_lr, options.warmup_steps, options.steps};
  const long long tokens_per_step =
      static_cast<long long>(options.batch) * options.seq_len * options.grad_accum;

  if (const int signal = StopSignals::requested())
    fail("stopped by ", StopSignals::name(signal), " before training began: nothing was written",
         resumed_from.empty() ? std::string() : "; " + resumed_from + " is as it was");
  // The run folder is made only once everything it depends on has loaded, so a command that
  // fails on bad input leaves nothing behind.
  if (leader && options.overwrite && !continues_this_folder)
    for (const fs::path& path : other_runs_files(options.out_dir)) {
      std::error_code error;
      fs::remove_all(path, error);
      LAYUP_CHECK(!error, "--overwrite: cannot remove ", path.string(), ": ", error.message());
    }
  if (leader) {
    std::error_code error;
    fs::create_directories(options.out_dir, error);
    LAYUP_CHECK(!error, "cannot create the run folder ", options.out_dir, ": ", error.message(),
                "; choose another --out");
  }
  JsonLinesLog log(leader ? (fs::path(options.out_dir) / "log.jsonl").string() : "/dev/null");
  ProgressLine progress(out, last_step, options.log_every);
  std::fprintf(out,
               "layup train: %s (%d layers, %d heads, width %d, %.1fM parameters), batch %dx%d x%d "
               "accumulation, %d steps, mode %s on %s (%s)\n  schedule: %s\n  run folder: %s\n",
               options.model_name.c_str(), config.n_layer, config.n_head, config.n_embd,
               parameter_count(config) / 1e6, options.batch, options.seq_len, options.grad_accum,
               options.steps, name_of(options.mode).c_str(), name_of(options.device).c_str(),
               name_of(options.dtype).c_str(), schedule_description.c_str(),
               options.out_dir.c_str());
  if (ranks > 1)
    std::fprintf(out, "  %d ranks (mpirun), %d micro-batches of each step on each\n", ranks,
                 options.grad_accum / ranks);
  if (trace) std::fprintf(out, "  trace: %s (every step)\n", options.trace_path.c_str());
  if (const std::string storage = schedule->storage_report(); !storage.empty())
    std::fprintf(out, "  %s\n", storage.c_str());
  std::fprintf(out, "%s", format_memory_plan(memory_plan, budgets).c_str());
  if (!resumed_from.empty()) progress.message("resumed from " + resumed_from);
  for (const std::string& note : resume_notes) progress.message("note: " + note);

  TrainResult result;
  result.reports = leader;
  result.initial_val_loss = NAN;
  result.final_val_loss = NAN;
  auto evaluate = [&](int step) {
    const float loss = mean_validation_loss(*schedule, val);
    log.write({{"step", step}, {"val_loss", loss}});
    char text[96];
    std::snprintf(text, sizeof text, "step %d: validation loss %.4f", step, loss);
    progress.message(text);
    return loss;
  };
  // The newest complete checkpoint, which a failed save leaves as it was.
  std::string intact_checkpoint = resumed_from;
  auto save = [&](int step) {
    TrainingProgress state;
    state.step = step;
    state.data_rng_state = sampler.state();
    state.tokens_seen = tokens_seen;
    state.options = run_settings(options);
    const double save_start_s = progress.elapsed_s();
    SavedCheckpoint saved;
    try {
      saved = save_schedule_checkpoint(
          options.out_dir, *schedule, state, options.checkpoint_contents,
          {shard_bytes, kDefaultStreamChunkBytes, options.keep_checkpoints});
    } catch (const Error& error) {
      progress.finish();
      // The cause first: the same words as anywhere else (a full disk, out of memory).
      fail(error.what(), ". The checkpoint of step ", step, " was not written. ",
           intact_checkpoint.empty()
               ? std::string("This run has no earlier checkpoint")
               : "The last complete checkpoint, " + intact_checkpoint + ", is intact" +
                     (options.checkpoint_contents == CheckpointContents::kFull
                          ? " (resume with `layup train --resume " + intact_checkpoint + "`)"
                          : std::string()),
           "; if the disk is full, free space in ", options.out_dir,
           ", give another --out or write less: --checkpoint-contents weights, "
           "--keep-checkpoints 1 or --no-checkpoints");
    }
    const double save_s = progress.elapsed_s() - save_start_s;
    result.last_checkpoint = intact_checkpoint = saved.path;
    log.write({{"step", step},
               {"checkpoint", saved.path},
               {"checkpoint_bytes", saved.bytes},
               {"checkpoint_s", save_s}});
    char text[128];
    std::snprintf(text, sizeof text, ": %.2f GB in %.1f s (%.2f GB/s)", saved.bytes / 1e9, save_s,
                  saved.bytes / 1e9 / std::max(save_s, 1e-9));
    progress.message("checkpoint " + saved.path + text);
  };

  if (options.eval_every > 0 && start_step == 0) result.initial_val_loss = evaluate(0);

  // This rank's micro-batches of each step: every rank draws the whole global batch, so the data
  // stream (and a checkpoint's position in it) is the same whatever the rank count, and keeps
  // its own consecutive share.
  const int local_micro_batches = options.grad_accum / ranks;
  std::vector<TokenBatchBuffer> buffers(local_micro_batches);
  std::vector<TokenBatch> micro_batches(local_micro_batches);
  TokenBatchBuffer other_ranks_batch;
  const double start_s = progress.elapsed_s();
  // Peak memory for the progress line: the GPU's (cudaMemGetInfo, all processes, read after each
  // step) on cuda, the process's peak resident set on the cpu.
  const bool on_cuda = options.device == DeviceKind::kCuda;
  long long peak_memory_bytes = 0;
  // Energy: read after every step; log.jsonl gets each step's share (from the last reading).
  std::unique_ptr<EnergyMeter> energy;
  std::vector<EnergyReading> energy_before;
  if (options.energy && start_step < last_step) {
    energy = std::make_unique<EnergyMeter>(
        energy_sources_for(options.device, memory_plan.request.attributes.pci_bus_id));
    energy->start();
    for (const EnergyReading& reading : energy->snapshot()) {
      if (!reading.available)
        progress.message("energy: " + reading.source + " unavailable (" +
                         reading.unavailable_reason + ")");
      energy_before.push_back(reading);
    }
  }
  result.steps_done = start_step;
  for (int step = start_step; step < last_step; ++step) {
    for (int i = 0; i < options.grad_accum; ++i) {
      if (i / local_micro_batches != rank) {
        sampler.next(other_ranks_batch);
        continue;
      }
      TokenBatchBuffer& mine = buffers[i % local_micro_batches];
      sampler.next(mine);
      micro_batches[i % local_micro_batches] = mine.view();
    }

    UpdateSettings settings;
    settings.adamw.hyper = {lr_schedule.at(step), options.beta1, options.beta2, options.eps,
                            options.weight_decay};
    settings.adamw.t = step + 1;
    settings.clip_max_norm = options.clip;
    const double step_start_s = progress.elapsed_s();
    const StepStats stats = [&] {
      TraceSpan traced(trace.get(), steps_track, "step", step + 1);
      return schedule->step(micro_batches, settings);
    }();
    const double step_s = progress.elapsed_s() - step_start_s;
    peak_memory_bytes = std::max(peak_memory_bytes,
                                 on_cuda ? device_memory_used_bytes() : process_peak_rss_bytes());
    if (!stats.applied) {
      progress.finish();
      fail("training diverged at step ", step + 1, ": the loss is ", stats.loss,
           " and the gradient norm ", stats.grad_norm,
           options.mode == Mode::kLayup && options.clip <= 0.0f
               ? "; blocks whose own gradient was finite were already updated in memory (layup "
                 "with --clip none updates during backward), the rest were not"
               : "; the parameters were not updated",
           result.last_checkpoint.empty()
               ? std::string(" and no checkpoint was written")
               : "; the last good checkpoint is " + result.last_checkpoint,
           ". Try a lower --lr (now ", options.lr, ") or a longer --warmup");
    }
    tokens_seen += tokens_per_step;
    const int done = step + 1;
    const double run_s = progress.elapsed_s() - start_s;
    const double tokens_per_s = tokens_per_step * (done - start_step) / run_s;
    nlohmann::json step_energy = nullptr;
    if (energy) {
      step_energy = nlohmann::json::object();
      std::vector<EnergyReading> now = energy->snapshot();
      for (size_t i = 0; i < now.size(); ++i)
        if (now[i].available) step_energy[now[i].source] = now[i].joules - energy_before[i].joules;
      energy_before = std::move(now);
    }
    log.write({{"step", done},
               {"loss", stats.loss},
               {"lr", settings.adamw.hyper.lr},
               {"grad_norm", stats.grad_norm},
               {"clip_factor", stats.clip_factor},
               {"blocks_redone", stats.blocks_redone},
               {"blocks_deferred", stats.blocks_deferred},
               {"step_ms", step_s * 1e3},
               {"tokens_per_s", tokens_per_s},
               {on_cuda ? "peak_device_bytes" : "peak_rss_bytes", peak_memory_bytes},
               {"elapsed_s", progress.elapsed_s()},
               {"energy_j", step_energy}});
    char text[256];
    std::snprintf(
        text, sizeof text,
        "step %d/%d | loss %.4f | lr %.2e | %.0f ms/step | %s tok/s | %s %.2f GiB | elapsed %s | "
        "ETA %s",
        done, last_step, stats.loss, settings.adamw.hyper.lr, step_s * 1e3,
        format_rate(tokens_per_s).c_str(), on_cuda ? "gpu mem" : "peak rss",
        peak_memory_bytes / 1073741824.0,
        ProgressLine::format_duration(progress.elapsed_s()).c_str(),
        ProgressLine::format_duration(run_s / (done - start_step) * (last_step - done)).c_str());
    progress.update(done, text);

    const bool last = done == last_step;
    if (options.eval_every > 0 && (done % options.eval_every == 0 || last))
      result.final_val_loss = evaluate(done);
    // A signal reaches the ranks at different moments: they stop together after the step one of
    // them saw it in.
    int stop = StopSignals::requested();
    if (ranks > 1)
      for (double seen : world->gather(stop)) stop = std::max(stop, static_cast<int>(seen));
    if (run_checkpoints &&
        ((options.checkpoint_every > 0 && done % options.checkpoint_every == 0) || last || stop)) {
      if (leader) save(done);
      if (ranks > 1) leader ? schedule->end_exports() : schedule->serve_exports();
    }
    if (stop && !last) {
      result.stopped_by = StopSignals::name(stop);
      log.write({{"step", done}, {"stopped_by", result.stopped_by}});
      progress.message(
          std::string("stopped by ") + result.stopped_by + " after step " + std::to_string(done) +
          (!options.checkpoints ? std::string("; no checkpoint (--no-checkpoints)")
           : options.checkpoint_contents == CheckpointContents::kWeights
               ? std::string("; its weights are saved (--checkpoint-contents weights: not "
                             "resumable)")
               : "; continue with: layup train --resume " + options.out_dir));
      result.steps_done = done;
      break;
    }
    result.steps_done = done;
  }
  progress.finish();
  if (energy) {
    result.energy = energy->stop();
    result.energy_steps = result.steps_done - start_step;
  }
  if (const std::string cpu_adamw = schedule->cpu_adamw_report(); !cpu_adamw.empty())
    std::fprintf(out, "  %s\n", cpu_adamw.c_str());
  if (trace) trace->write(options.trace_path);
  // Measured beside planned, and the process-wide reading as a cross-check of both.
  std::string process_memory =
      "process peak resident set (VmHWM): " +
      format_bytes(static_cast<size_t>(process_peak_rss_bytes())) +
      " (the plan's host memory at the peak: " + format_bytes(memory_plan.host_memory_bytes()) +
      ")";
  if (on_cuda)
    process_memory += "\n  GPU memory in use, all processes (cudaMemGetInfo): " +
                      format_bytes(static_cast<size_t>(std::max(0LL, device_memory_used_bytes())));
  std::fprintf(out, "%s  %s\n", format_memory_report(memory_plan, *accountant).c_str(),
               process_memory.c_str());

  if (options.sample_tokens > 0 && result.steps_done == options.steps) {
    Rng rng(options.seed + 1);
    std::vector<int32_t> prompt = tokenizer.encode(options.sample_prompt);
    if (prompt.empty()) prompt.push_back(tokenizer.document_separator());
    // Ids the tokenizer can spell: a model's vocabulary may be larger than its tokenizer's (a
    // Llama-family shape trained on the shipped GPT-2 tokens).
    const int vocab = std::min(config.vocab_size, tokenizer.vocab_size());
    const std::vector<int32_t> tokens =
        generate([&](const TokenBatch& batch) { return schedule->forward_logits(batch); }, prompt,
                 options.seq_len, vocab, config.padded_vocab_size,
                 {options.sample_tokens, options.temperature, options.top_k}, rng);
    result.sample = tokenizer.decode(tokens);
    log.write({{"sample", result.sample}});
  }
  result.wall_s = progress.elapsed_s();
  return result;
}

}  // namespace layup
