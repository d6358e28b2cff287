// `layup train`: flags -> TrainOptions -> the training loop.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "memory/plan_file.h"
#include "train/progress_line.h"
#include "train/trainer.h"

namespace layup {

namespace {

struct TrainFlags {
  TrainOptions options;
  ModelFlags model;
  std::string clip = "1.0";
  std::string plan_path;
  int threads = 0;
};

}  // namespace

void add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  TrainOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train a GPT-2 model. With no arguments: a small GPT-2 on the shipped public-domain "
      "corpus, with progress, evaluation, checkpoints, a JSON-lines log and a sample at the end.");
  add_model_flags(*cmd, flags->model, "small");
  cmd->add_option("--seq-len", o.seq_len, "Tokens per sequence (T)")->capture_default_str();
  cmd->add_option("--batch", o.batch, "Sequences per micro-batch (B)")->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches accumulated per update")
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Optimizer updates (sets the LR schedule's length)")
      ->capture_default_str();
  cmd->add_option("--until-step", o.until_step,
                  "Stop after this update and checkpoint (resume later with --resume)");
  cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", o.min_lr, "Learning rate at the end of the cosine decay")
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup_steps,
                  "Linear warmup updates (the default is cut to --steps on a shorter run)")
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay,
                  "AdamW decoupled weight decay, applied to the matrices (attention, MLP, token "
                  "embedding = LM head) and NOT to biases, layer-norm gains or position embeddings")
      ->capture_default_str();
  cmd->add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--eps", o.eps, "AdamW epsilon")->capture_default_str();
  add_clip_flags(*cmd, flags->clip, o.layup_clip);
  add_layup_head_flag(*cmd, o.layup_head);
  add_optimizer_placement_flags(*cmd, o.optimizer_placement, o.offload_dir);
  cmd->add_option("--eval-every", o.eval_every, "Validation every N updates (0: never)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", o.eval_batches, "Validation batches per evaluation")
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every,
                  "Checkpoint every N updates (and always at the end; 0: only at the end)")
      ->capture_default_str();
  cmd->add_flag("--no-checkpoints{false}", o.checkpoints,
                "Write no checkpoint, not even at the end or on a stop signal (a timing run)");
  cmd->add_option("--keep-checkpoints", o.keep_checkpoints, "Checkpoints kept in the run folder")
      ->capture_default_str();
  add_choice_option(*cmd, "--checkpoint-contents", o.checkpoint_contents, kCheckpointContentsNames,
                    "What checkpoints hold: full (the weights and the optimizer state: resumable) "
                    "or weights (Hugging Face weights only, a third of the disk: for transformers "
                    "and `layup sample`, not resumable)");
  cmd->add_option("--checkpoint-shard-mb", o.checkpoint_shard_mb,
                  "Split checkpoint files larger than this many MB (10^6 bytes) into shards, as "
                  "Hugging Face's save_pretrained does")
      ->capture_default_str();
  cmd->add_option("--log-every", o.log_every,
                  "Progress line every N updates when stderr is not a terminal")
      ->capture_default_str();
  cmd->add_option("--data", o.data_dir,
                  "Folder of train_*.bin / val_*.bin token shards (default: the shipped corpus, "
                  "tokenized once into ~/.cache/layup)");
  cmd->add_option("--tokenizer", o.tokenizer_dir,
                  "A tokenizer.json, or a folder with one or with GPT-2's gpt2.tiktoken or "
                  "encoder.json + vocab.bpe (default: --init-from's folder if it has a "
                  "tokenizer.json, else the shipped GPT-2 one)");
  cmd->add_option("--init-from", o.init_from,
                  "Start from a Hugging Face model folder (GPT-2, Llama, Qwen2, Mistral: "
                  "config.json and safetensors weights): its shape and weights, fresh AdamW "
                  "moments");
  cmd->add_option("--out", o.out_dir,
                  "Run folder for checkpoints and log.jsonl (default: "
                  "runs/train-DATE-TIME, or the resumed run's folder)");
  cmd->add_option("--resume", o.resume,
                  "Continue from a checkpoint or a run folder's latest, with the run's own "
                  "settings; a flag given too is applied if it leaves the trajectory alone "
                  "(--eval-every, --threads, --mode...), refused if it would change it, except "
                  "--steps, which extends (or shortens) the learning-rate schedule");
  cmd->add_flag("--overwrite", o.overwrite,
                "Let a new run replace the checkpoints and log.jsonl of another run in its --out "
                "folder (without it such a folder is refused)");
  cmd->add_option("--sample-tokens", o.sample_tokens, "Tokens sampled at the end (0: none)")
      ->capture_default_str();
  cmd->add_option("--prompt", o.sample_prompt, "Prompt of the final sample");
  cmd->add_option("--temperature", o.temperature, "Sampling temperature")->capture_default_str();
  cmd->add_option("--top-k", o.top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  add_seed_flag(*cmd, o.seed, "Seed of initialization and batch order");
  add_device_flags(*cmd, o.device, o.dtype);
  add_schedule_flags(*cmd, o.mode, o.cpu_workers);
  add_cuda_backend_flags(*cmd, o.recompute, o.algorithms, o.attention);
  cmd->add_option("--trace", o.trace_path,
                  "Write a Chrome/Perfetto trace of every step here (JSON; open in "
                  "ui.perfetto.dev): device work and each CPU worker on tracks of their own");
  cmd->add_flag("--energy", o.energy,
                "Read energy over the steps: the GPU's (NVML) and the CPU packages' (RAPL "
                "powercap), per step in log.jsonl and in total at the end; a source that cannot "
                "be read is reported with the reason");
  cmd->add_option("--threads", flags->threads, "CPU threads (default: all cores)");
  add_memory_flags(*cmd, o.memory_budget, o.device_budget, o.host_budget, o.allow_overcommit,
                   o.place, flags->plan_path);

  cmd->callback([flags, cmd]() {
    TrainOptions options = flags->options;
    LAYUP_CHECK(options.resume.empty() || !flags->model.any_given(),
                "--resume takes the model from the checkpoint; drop --model, --layers, --heads, "
                "--dim and --context");
    LAYUP_CHECK(options.init_from.empty() || !flags->model.any_given(),
                "--init-from takes the model from ", options.init_from,
                "/config.json; drop --model, --layers, --heads, --dim and --context");
    LAYUP_CHECK(options.init_from.empty() || options.resume.empty(),
                "--init-from starts a new run from a model's weights and --resume continues a "
                "run from its checkpoint; give one of them");
    if (!options.init_from.empty()) {
      options.model = read_hf_model_config(options.init_from);
      options.model_name = options.init_from;
    } else if (options.resume.empty()) {
      options.model = flags->model.resolve(options.seq_len);
      options.model_name = flags->model.name();
    }
    options.clip = parse_clip_flag(flags->clip);
    options.place = place_flags_with_plan(flags->plan_path, options.place);
    if (!flags->plan_path.empty()) options.given_flags.push_back("--place");
    for (const CLI::Option* option : cmd->get_options())
      if (option->count() > 0) options.given_flags.push_back(option->get_name());
    clamp_default_warmup(options);
    apply_threads_flag(flags->threads);

    const TrainResult result = train(options);
    if (!result.reports) return;  // another rank of mpirun's: rank 0 reports
    if (!result.stopped_by.empty()) std::printf("stopped by %s: ", result.stopped_by.c_str());
    std::printf("trained to step %d in %s", result.steps_done,
                ProgressLine::format_duration(result.wall_s).c_str());
    if (std::isfinite(result.initial_val_loss))
      std::printf("; validation loss %.4f at the start", result.initial_val_loss);
    if (std::isfinite(result.final_val_loss))
      std::printf("; validation loss %.4f at the end", result.final_val_loss);
    std::printf("\n");
    if (!result.last_checkpoint.empty())
      std::printf("checkpoint: %s\n", result.last_checkpoint.c_str());
    if (!result.stopped_by.empty() && !result.last_checkpoint.empty() &&
        options.checkpoint_contents == CheckpointContents::kFull)
      std::printf("continue with: layup train --resume %s\n",
                  std::filesystem::path(result.last_checkpoint).parent_path().c_str());
    if (!options.trace_path.empty()) std::printf("trace: %s\n", options.trace_path.c_str());
    const long long tokens_per_step =
        static_cast<long long>(options.batch) * options.seq_len * options.grad_accum;
    for (const EnergyReading& reading : result.energy)
      std::printf("energy: %s\n",
                  describe_energy(reading, result.energy_steps, tokens_per_step).c_str());
    if (!result.sample.empty()) std::printf("\nsample:\n%s\n", result.sample.c_str());
  });
}

}  // namespace layup
