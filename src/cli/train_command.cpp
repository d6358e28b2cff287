// `layup train`: flags -> TrainOptions -> the training loop.

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "data/instruction_data.h"
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
  add_batch_flags(*cmd, o.batch, o.seq_len);
  add_whole_flag(*cmd, "--grad-accum", o.grad_accum, at_least(1),
                 "Micro-batches accumulated per update")
      ->capture_default_str();
  add_whole_flag(*cmd, "--steps", o.steps, at_least(1),
                 "Optimizer updates (sets the LR schedule's length)")
      ->capture_default_str();
  add_whole_flag(*cmd, "--until-step", o.until_step, shown_as(at_least(1), "1 .. --steps"),
                 "Stop after this update and checkpoint (resume later with --resume)")
      ->default_str("none");
  add_real_flag(*cmd, "--lr", o.lr, positive_real(), "Peak learning rate")->capture_default_str();
  add_real_flag(*cmd, "--min-lr", o.min_lr, real_between(0, false, INFINITY, false, "0 .. --lr"),
                "Learning rate at the end of the cosine decay")
      ->capture_default_str();
  add_whole_flag(*cmd, "--warmup", o.warmup_steps, shown_as(at_least(0), "0 .. --steps"),
                 "Linear warmup updates (the default is cut to --steps on a shorter run)")
      ->capture_default_str();
  add_real_flag(*cmd, "--weight-decay", o.weight_decay, non_negative_real(),
                "AdamW decoupled weight decay, applied to the matrices (attention, MLP, token "
                "embedding = LM head) and NOT to biases, layer-norm gains or position embeddings")
      ->capture_default_str();
  const RealRange below_one = real_between(0, false, 1, true, "[0, 1)");
  add_real_flag(*cmd, "--beta1", o.beta1, below_one, "AdamW beta1")->capture_default_str();
  add_real_flag(*cmd, "--beta2", o.beta2, below_one, "AdamW beta2")->capture_default_str();
  add_real_flag(*cmd, "--eps", o.eps, positive_real(), "AdamW epsilon")->capture_default_str();
  add_clip_flags(*cmd, flags->clip, o.layup_clip);
  add_layup_head_flag(*cmd, o.layup_head);
  add_optimizer_placement_flags(*cmd, o.optimizer_placement, o.offload_dir);
  add_optimizer_state_flag(*cmd, o.optimizer_state);
  add_accumulate_flag(*cmd, o.accumulation);
  add_streamed_blocks_flag(*cmd, o.streamed_blocks);
  add_whole_flag(*cmd, "--eval-every", o.eval_every, at_least(0),
                 "Validation every N updates (0: never)")
      ->capture_default_str();
  add_whole_flag(*cmd, "--eval-batches", o.eval_batches, at_least(1),
                 "Validation batches per evaluation")
      ->capture_default_str();
  add_whole_flag(*cmd, "--checkpoint-every", o.checkpoint_every, at_least(0),
                 "Checkpoint every N updates (and always at the end; 0: only at the end)")
      ->capture_default_str();
  cmd->add_flag("--no-checkpoints{false}", o.checkpoints,
                "Write no checkpoint, not even at the end or on a stop signal (a timing run)");
  add_whole_flag(*cmd, "--keep-checkpoints", o.keep_checkpoints, at_least(1),
                 "Checkpoints kept in the run folder")
      ->capture_default_str();
  add_choice_option(*cmd, "--checkpoint-contents", o.checkpoint_contents, kCheckpointContentsNames,
                    "What checkpoints hold: full (the weights and the optimizer state: resumable) "
                    "or weights (Hugging Face weights only, a third of the disk: for transformers "
                    "and `layup sample`, not resumable)");
  add_choice_option(*cmd, "--save-dtype", o.save_dtype, kWeightsDtypeNames,
                    "The dtype of the checkpoints' model weights (bf16 rounds to nearest even; "
                    "the training state stays fp32 and a resume is exact either way)")
      ->default_str("--init-from's dtype, else fp32");
  add_whole_flag(*cmd, "--checkpoint-shard-mb", o.checkpoint_shard_mb, at_least(1),
                 "Split checkpoint files larger than this many MB (10^6 bytes) into shards, as "
                 "Hugging Face's save_pretrained does")
      ->capture_default_str();
  add_whole_flag(*cmd, "--log-every", o.log_every, at_least(1),
                 "Progress line every N updates when stderr is not a terminal")
      ->capture_default_str();
  add_path_flag(*cmd, "--data", o.data_dir, "folder or file",
                "Folder of train_*.bin / val_*.bin token shards, or a .jsonl file of examples "
                "(or a text file) as `layup tokenize` reads it, tokenized once into "
                "~/.cache/layup (as is the shipped corpus)")
      ->default_str("the shipped corpus");
  add_choice_option(
      *cmd, "--learn", o.learn, kLearnTokensNames,
      "With a --data file: which tokens of prompt/completion and chat lines the loss learns, as "
      "`layup tokenize --learn`");
  cmd->add_flag("--no-packing{false}", o.pack_examples,
                "Instruction data: one example per window, the rest padding, instead of packing "
                "as many whole examples as fit (packed examples attend to the ones before them)");
  add_path_flag(*cmd, "--tokenizer", o.tokenizer_dir, "folder or tokenizer.json",
                "A tokenizer.json, or a folder with one or with GPT-2's gpt2.tiktoken or "
                "encoder.json + vocab.bpe")
      ->default_str("--init-from's tokenizer.json, else shipped");
  add_path_flag(*cmd, "--init-from", o.init_from, "model folder",
                "Start from a Hugging Face model folder (GPT-2, Llama, Qwen2, Mistral: "
                "config.json and safetensors weights): its shape and weights, fresh AdamW "
                "moments");
  add_path_flag(*cmd, "--out", o.out_dir, "folder", "Run folder for checkpoints and log.jsonl")
      ->default_str("runs/train-DATE-TIME (on --resume: the run's folder)");
  add_path_flag(*cmd, "--resume", o.resume, "checkpoint or run folder",
                "Continue from a checkpoint or a run folder's latest, with the run's own "
                "settings; a flag given too is applied if it leaves the trajectory alone "
                "(--eval-every, --threads, --mode...), refused if it would change it, except "
                "--steps, which extends (or shortens) the learning-rate schedule");
  cmd->add_flag("--overwrite", o.overwrite,
                "Let a new run replace the checkpoints and log.jsonl of another run in its --out "
                "folder (without it such a folder is refused)");
  add_whole_flag(*cmd, "--sample-tokens", o.sample_tokens, at_least(0),
                 "Tokens sampled at the end (0: none)")
      ->capture_default_str();
  add_text_flag(*cmd, "--prompt", o.sample_prompt, "text", "Prompt of the final sample")
      ->default_str("a newline");
  add_real_flag(*cmd, "--temperature", o.temperature, positive_real(), "Sampling temperature")
      ->capture_default_str();
  add_whole_flag(*cmd, "--top-k", o.top_k, at_least(0),
                 "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  add_seed_flag(*cmd, o.seed, "Seed of initialization and batch order");
  add_device_flags(*cmd, o.device, o.dtype);
  add_schedule_flags(*cmd, o.mode, o.cpu_workers);
  add_cuda_backend_flags(*cmd, o.recompute, o.algorithms, o.attention);
  add_path_flag(*cmd, "--trace", o.trace_path, "file",
                "Write a Chrome/Perfetto trace of every step here (JSON; open in "
                "ui.perfetto.dev): device work and each CPU worker on tracks of their own");
  cmd->add_flag("--energy", o.energy,
                "Read energy over the steps: the GPU's (NVML) and the CPU packages' (RAPL "
                "powercap), per step in log.jsonl and in total at the end; a source that cannot "
                "be read is reported with the reason");
  add_threads_flag(*cmd, flags->threads);
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
