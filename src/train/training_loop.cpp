// The steps of `layup train` (training_loop.h).
#include "train/training_loop.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/rng.h"
#include "optim/lr_schedule.h"
#include "sample/generate.h"
#include "train/memory_usage.h"
#include "train/schedule_checkpoint.h"
#include "train/stop_signals.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

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

float mean_validation_loss(Schedule& schedule, const ValidationBatches& val) {
  double sum = 0.0;
  TokenBatchBuffer buffer;
  for (int i = 0; i < val.size(); ++i) {
    val.get(i, buffer);
    sum += schedule.evaluate(buffer.view());
  }
  return static_cast<float>(sum / val.size());
}

// Energy over the steps: read after every step, each step's share (from the last reading) logged.
class StepEnergy {
 public:
  StepEnergy(const TrainOptions& options, const MemoryPlan& plan, ProgressLine& progress) {
    meter_ = std::make_unique<EnergyMeter>(
        energy_sources_for(options.device, plan.request.attributes.pci_bus_id));
    meter_->start();
    for (const EnergyReading& reading : meter_->snapshot()) {
      if (!reading.available)
        progress.message("energy: " + reading.source + " unavailable (" +
                         reading.unavailable_reason + ")");
      before_.push_back(reading);
    }
  }
  nlohmann::json step_joules() {
    nlohmann::json joules = nlohmann::json::object();
    std::vector<EnergyReading> now = meter_->snapshot();
    for (size_t i = 0; i < now.size(); ++i)
      if (now[i].available) joules[now[i].source] = now[i].joules - before_[i].joules;
    before_ = std::move(now);
    return joules;
  }
  std::vector<EnergyReading> stop() { return meter_->stop(); }

 private:
  std::unique_ptr<EnergyMeter> meter_;
  std::vector<EnergyReading> before_;
};

}  // namespace

JsonLinesLog::JsonLinesLog(const std::string& path) : path_(path), out_(path, std::ios::app) {
  LAYUP_CHECK(out_, "cannot open the log file '", path, "' for appending: ", std::strerror(errno));
  std::error_code not_regular;  // /dev/null on the other ranks
  whole_bytes_ = fs::file_size(path, not_regular);
  regular_ = !not_regular;
}

// Invalid UTF-8 (a sample cut between the bytes of one character: GPT-2's tokens are bytes) is
// written as U+FFFD instead of throwing at the end of the run.
void JsonLinesLog::write(const nlohmann::json& record) {
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
  fail(
      "cannot write to the log file '", path_,
      "': ", error ? std::strerror(error) : "the write failed",
      error == EFBIG ? " (past this process's file size limit: ulimit -f)" : " (is the disk full?)",
      "; the run stops here rather than leave a log with holes");
}

TrainingLoop::TrainingLoop(const TrainOptions& options, const ResumePoint& resume,
                           const RunRanks& ranks, PreparedRun& run, TrainingData& data,
                           long long tokens_seen, const HfFolderExtras& checkpoint_extras)
    : options_(options),
      resume_(resume),
      ranks_(ranks),
      run_(run),
      data_(data),
      checkpoint_extras_(checkpoint_extras),
      tokens_seen_(tokens_seen),
      last_step_(options.until_step > 0 ? options.until_step : options.steps),
      tokens_per_step_(static_cast<long long>(options.batch) * options.seq_len *
                       options.grad_accum),
      log_(ranks.leader ? (fs::path(options.out_dir) / "log.jsonl").string() : "/dev/null"),
      progress_(ranks.out, last_step_, options.log_every),
      intact_checkpoint_(resume.from),
      // Every rank draws the whole global batch, so the data stream (and a checkpoint's position
      // in it) is the same whatever the rank count, and keeps its own consecutive share.
      buffers_(options.grad_accum / ranks.count),
      micro_batches_(options.grad_accum / ranks.count) {}

void TrainingLoop::print_header() {
  const TrainOptions& o = options_;
  const ModelConfig& config = o.model;
  FILE* const out = ranks_.out;
  std::fprintf(out,
               "layup train: %s (%d layers, %d heads, width %d, %.1fM parameters), batch %dx%d x%d "
               "accumulation, %d steps, mode %s on %s (%s)\n  schedule: %s\n  run folder: %s\n",
               o.model_name.c_str(), config.n_layer, config.n_head, config.n_embd,
               parameter_count(config) / 1e6, o.batch, o.seq_len, o.grad_accum, o.steps,
               name_of(o.mode).c_str(), name_of(o.device).c_str(), name_of(o.dtype).c_str(),
               run_.schedule_description.c_str(), o.out_dir.c_str());
  if (ranks_.count > 1)
    std::fprintf(out, "  %d ranks (mpirun), %d micro-batches of each step on each\n", ranks_.count,
                 o.grad_accum / ranks_.count);
  if (run_.trace) std::fprintf(out, "  trace: %s (every step)\n", o.trace_path.c_str());
  if (const PackedExamples* packed = data_.sampler->packed()) {
    // What the flags made of the data, and how examples share a window (docs/models.md).
    const double positions = static_cast<double>(packed->windows.size()) * o.seq_len;
    std::fprintf(out,
                 "  instruction data: %zu examples in %zu windows of %d tokens, %s; %zu split over "
                 "several windows; %zu targets learned (%.1f%% of the positions)\n",
                 packed->examples, packed->windows.size(), o.seq_len + 1,
                 o.pack_examples ? "packed (each attends to the examples before it in its window)"
                                 : "one per window (--no-packing)",
                 packed->split_examples, packed->learned_targets,
                 100.0 * static_cast<double>(packed->learned_targets) / positions);
  }
  if (const std::string storage = run_.schedule->storage_report(); !storage.empty())
    std::fprintf(out, "  %s\n", storage.c_str());
  std::fprintf(out, "%s", format_memory_plan(run_.planned.plan, run_.planned.budgets).c_str());
  if (!resume_.from.empty()) progress_.message("resumed from " + resume_.from);
  for (const std::string& note : resume_.notes) progress_.message("note: " + note);
}

float TrainingLoop::evaluate(int step) {
  const float loss = mean_validation_loss(*run_.schedule, *data_.validation);
  log_.write({{"step", step}, {"val_loss", loss}});
  char text[96];
  std::snprintf(text, sizeof text, "step %d: validation loss %.4f", step, loss);
  progress_.message(text);
  return loss;
}

void TrainingLoop::save_checkpoint(int step, TrainResult& result) {
  TrainingProgress state;
  state.step = step;
  state.data_rng_state = data_.sampler->state();
  state.tokens_seen = tokens_seen_;
  state.options = run_settings(options_);
  const double save_start_s = progress_.elapsed_s();
  const size_t shard_bytes = static_cast<size_t>(options_.checkpoint_shard_mb) * 1000 * 1000;
  SavedCheckpoint saved;
  try {
    saved = save_schedule_checkpoint(
        options_.out_dir, *run_.schedule, state, options_.checkpoint_contents,
        {shard_bytes, kDefaultStreamChunkBytes, options_.keep_checkpoints, checkpoint_extras_});
  } catch (const Error& error) {
    progress_.finish();
    // The cause first: the same words as anywhere else (a full disk, out of memory).
    fail(error.what(), ". The checkpoint of step ", step, " was not written. ",
         intact_checkpoint_.empty()
             ? std::string("This run has no earlier checkpoint")
             : "The last complete checkpoint, " + intact_checkpoint_ + ", is intact" +
                   (options_.checkpoint_contents == CheckpointContents::kFull
                        ? " (resume with `layup train --resume " + intact_checkpoint_ + "`)"
                        : std::string()),
         "; if the disk is full, free space in ", options_.out_dir,
         ", give another --out or write less: --checkpoint-contents weights, "
         "--keep-checkpoints 1 or --no-checkpoints");
  }
  const double save_s = progress_.elapsed_s() - save_start_s;
  result.last_checkpoint = intact_checkpoint_ = saved.path;
  log_.write({{"step", step},
              {"checkpoint", saved.path},
              {"checkpoint_bytes", saved.bytes},
              {"checkpoint_s", save_s}});
  char text[128];
  std::snprintf(text, sizeof text, ": %.2f GB in %.1f s (%.2f GB/s)", saved.bytes / 1e9, save_s,
                saved.bytes / 1e9 / std::max(save_s, 1e-9));
  progress_.message("checkpoint " + saved.path + text);
}

void TrainingLoop::draw_micro_batches() {
  const int local = static_cast<int>(buffers_.size());
  for (int i = 0; i < options_.grad_accum; ++i) {
    if (i / local != ranks_.rank) {
      data_.sampler->next(other_ranks_batch_);
      continue;
    }
    TokenBatchBuffer& mine = buffers_[i % local];
    data_.sampler->next(mine);
    micro_batches_[i % local] = mine.view();
  }
}

TrainResult TrainingLoop::run() {
  const TrainOptions& o = options_;
  const int start_step = resume_.step;
  TrainResult result;
  result.reports = ranks_.leader;
  result.initial_val_loss = NAN;
  result.final_val_loss = NAN;
  if (o.eval_every > 0 && start_step == 0) result.initial_val_loss = evaluate(0);

  const LrSchedule lr_schedule{o.lr, o.min_lr, o.warmup_steps, o.steps};
  const double start_s = progress_.elapsed_s();
  // Peak memory for the progress line: the GPU's (cudaMemGetInfo, all processes, read after each
  // step) on cuda, the process's peak resident set on the cpu.
  const bool on_cuda = o.device == DeviceKind::kCuda;
  long long peak_memory_bytes = 0;
  std::unique_ptr<StepEnergy> energy;
  if (o.energy && start_step < last_step_)
    energy = std::make_unique<StepEnergy>(o, run_.planned.plan, progress_);
  result.steps_done = start_step;
  for (int step = start_step; step < last_step_; ++step) {
    draw_micro_batches();
    UpdateSettings settings;
    settings.adamw.hyper = {lr_schedule.at(step), o.beta1, o.beta2, o.eps, o.weight_decay};
    settings.adamw.t = step + 1;
    settings.clip_max_norm = o.clip;
    const double step_start_s = progress_.elapsed_s();
    const StepStats stats = [&] {
      TraceSpan traced(run_.trace.get(), run_.steps_track, "step", step + 1);
      return run_.schedule->step(micro_batches_, settings);
    }();
    const double step_s = progress_.elapsed_s() - step_start_s;
    peak_memory_bytes = std::max(peak_memory_bytes,
                                 on_cuda ? device_memory_used_bytes() : process_peak_rss_bytes());
    if (!stats.applied) {
      progress_.finish();
      fail("training diverged at step ", step + 1, ": the loss is ", stats.loss,
           " and the gradient norm ", stats.grad_norm,
           o.mode == Mode::kLayup && o.clip <= 0.0f
               ? "; blocks whose own gradient was finite were already updated in memory (layup "
                 "with --clip none updates during backward), the rest were not"
               : "; the parameters were not updated",
           result.last_checkpoint.empty()
               ? std::string(" and no checkpoint was written")
               : "; the last good checkpoint is " + result.last_checkpoint,
           ". Try a lower --lr (now ", o.lr, ") or a longer --warmup");
    }
    tokens_seen_ += tokens_per_step_;
    const int done = step + 1;
    const double run_s = progress_.elapsed_s() - start_s;
    const double tokens_per_s = tokens_per_step_ * (done - start_step) / run_s;
    log_.write({{"step", done},
                {"loss", stats.loss},
                {"lr", settings.adamw.hyper.lr},
                {"grad_norm", stats.grad_norm},
                {"clip_factor", stats.clip_factor},
                {"blocks_redone", stats.blocks_redone},
                {"blocks_deferred", stats.blocks_deferred},
                {"step_ms", step_s * 1e3},
                {"tokens_per_s", tokens_per_s},
                {on_cuda ? "peak_device_bytes" : "peak_rss_bytes", peak_memory_bytes},
                {"elapsed_s", progress_.elapsed_s()},
                {"energy_j", energy ? energy->step_joules() : nlohmann::json(nullptr)}});
    char text[256];
    std::snprintf(
        text, sizeof text,
        "step %d/%d | loss %.4f | lr %.2e | %.0f ms/step | %s tok/s | %s %.2f GiB | elapsed %s | "
        "ETA %s",
        done, last_step_, stats.loss, settings.adamw.hyper.lr, step_s * 1e3,
        format_rate(tokens_per_s).c_str(), on_cuda ? "gpu mem" : "peak rss",
        peak_memory_bytes / 1073741824.0,
        ProgressLine::format_duration(progress_.elapsed_s()).c_str(),
        ProgressLine::format_duration(run_s / (done - start_step) * (last_step_ - done)).c_str());
    progress_.update(done, text);

    const bool last = done == last_step_;
    if (o.eval_every > 0 && (done % o.eval_every == 0 || last))
      result.final_val_loss = evaluate(done);
    // A signal reaches the ranks at different moments: they stop together after the step one of
    // them saw it in.
    int stop = StopSignals::requested();
    if (ranks_.count > 1)
      for (double seen : ranks_.world->gather(stop)) stop = std::max(stop, static_cast<int>(seen));
    if (ranks_.take_part_in_checkpoints &&
        ((o.checkpoint_every > 0 && done % o.checkpoint_every == 0) || last || stop)) {
      if (ranks_.leader) save_checkpoint(done, result);
      if (ranks_.count > 1)
        ranks_.leader ? run_.schedule->end_exports() : run_.schedule->serve_exports();
    }
    result.steps_done = done;
    if (stop && !last) {
      result.stopped_by = StopSignals::name(stop);
      log_.write({{"step", done}, {"stopped_by", result.stopped_by}});
      progress_.message(
          std::string("stopped by ") + result.stopped_by + " after step " + std::to_string(done) +
          (!o.checkpoints ? std::string("; no checkpoint (--no-checkpoints)")
           : o.checkpoint_contents == CheckpointContents::kWeights
               ? std::string("; its weights are saved (--checkpoint-contents weights: not "
                             "resumable)")
               : "; continue with: layup train --resume " + o.out_dir));
      break;
    }
  }
  progress_.finish();
  if (energy) {
    result.energy = energy->stop();
    result.energy_steps = result.steps_done - start_step;
  }
  return result;
}

void TrainingLoop::finish(TrainResult& result) {
  const TrainOptions& o = options_;
  Schedule& schedule = *run_.schedule;
  FILE* const out = ranks_.out;
  if (const std::string cpu_adamw = schedule.cpu_adamw_report(); !cpu_adamw.empty())
    std::fprintf(out, "  %s\n", cpu_adamw.c_str());
  if (run_.trace) run_.trace->write(o.trace_path);
  // Measured beside planned, and the process-wide reading as a cross-check of both.
  const MemoryPlan& plan = run_.planned.plan;
  std::string process_memory =
      "process peak resident set (VmHWM): " +
      format_bytes(static_cast<size_t>(process_peak_rss_bytes())) +
      " (the plan's host memory at the peak: " + format_bytes(plan.host_memory_bytes()) + ")";
  if (o.device == DeviceKind::kCuda)
    process_memory += "\n  GPU memory in use, all processes (cudaMemGetInfo): " +
                      format_bytes(static_cast<size_t>(std::max(0LL, device_memory_used_bytes())));
  std::fprintf(out, "%s  %s\n", format_memory_report(plan, *run_.accountant).c_str(),
               process_memory.c_str());

  if (o.sample_tokens > 0 && result.steps_done == o.steps) {
    const Tokenizer& tokenizer = *data_.tokenizer;
    Rng rng(o.seed + 1);
    std::vector<int32_t> prompt = tokenizer.encode(o.sample_prompt);
    if (prompt.empty()) prompt.push_back(tokenizer.document_separator());
    // Ids the tokenizer can spell: a model's vocabulary may be larger than its tokenizer's (a
    // Llama-family shape trained on the shipped GPT-2 tokens).
    const int vocab = std::min(o.model.vocab_size, tokenizer.vocab_size());
    const std::vector<int32_t> tokens = generate(
        [&](const TokenBatch& batch) { return schedule.forward_logits(batch); }, prompt, o.seq_len,
        vocab, o.model.padded_vocab_size, {o.sample_tokens, o.temperature, o.top_k}, rng);
    result.sample = tokenizer.decode(tokens);
    log_.write({{"sample", result.sample}});
  }
  result.wall_s = progress_.elapsed_s();
}

}  // namespace layup
