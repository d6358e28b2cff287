// Checks of `layup train`'s options.
#include "train/train_options.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "core/error.h"
#include "memory/memory_plan.h"
#include "schedule/schedule.h"

namespace layup {

void validate_train_options(const TrainOptions& o) {
  validate_config(o.model);
  LAYUP_CHECK(o.batch >= 1, "--batch must be at least 1 (got ", o.batch, ")");
  LAYUP_CHECK(o.seq_len >= 1, "--seq-len must be at least 1 (got ", o.seq_len, ")");
  LAYUP_CHECK(o.seq_len <= o.model.n_positions, "--seq-len ", o.seq_len,
              " is above the model's context of ", o.model.n_positions,
              " positions; use --seq-len ", o.model.n_positions, " or less");
  LAYUP_CHECK(o.grad_accum >= 1, "--grad-accum must be at least 1 (got ", o.grad_accum, ")");
  LAYUP_CHECK(o.steps >= 1, "--steps must be at least 1 (got ", o.steps, ")");
  LAYUP_CHECK(o.until_step == -1 || (o.until_step >= 1 && o.until_step <= o.steps), "--until-step ",
              o.until_step, " must lie between 1 and --steps ", o.steps);
  LAYUP_CHECK(o.lr > 0.0f, "--lr must be positive (got ", o.lr, ")");
  LAYUP_CHECK(o.min_lr >= 0.0f && o.min_lr <= o.lr, "--min-lr ", o.min_lr,
              " must lie between 0 and --lr ", o.lr);
  LAYUP_CHECK(o.warmup_steps >= 0 && o.warmup_steps <= o.steps, "--warmup ", o.warmup_steps,
              " must lie between 0 and --steps ", o.steps);
  LAYUP_CHECK(o.weight_decay >= 0.0f, "--weight-decay must not be negative (got ", o.weight_decay,
              ")");
  LAYUP_CHECK(o.beta1 >= 0.0f && o.beta1 < 1.0f, "--beta1 must lie in [0, 1) (got ", o.beta1, ")");
  LAYUP_CHECK(o.beta2 >= 0.0f && o.beta2 < 1.0f, "--beta2 must lie in [0, 1) (got ", o.beta2, ")");
  LAYUP_CHECK(o.eps > 0.0f, "--eps must be positive (got ", o.eps, ")");
  LAYUP_CHECK(o.eval_every >= 0, "--eval-every must not be negative");
  LAYUP_CHECK(o.eval_batches >= 1, "--eval-batches must be at least 1");
  LAYUP_CHECK(o.checkpoint_every >= 0, "--checkpoint-every must not be negative");
  LAYUP_CHECK(o.keep_checkpoints >= 1, "--keep-checkpoints must be at least 1");
  LAYUP_CHECK(o.sample_tokens >= 0, "--sample-tokens must not be negative");
  LAYUP_CHECK(o.temperature > 0.0f, "--temperature must be positive (got ", o.temperature, ")");
  LAYUP_CHECK(o.top_k >= 0, "--top-k must not be negative (0 = the whole vocabulary)");
  const std::vector<std::string>& modes = schedule_modes();
  LAYUP_CHECK(std::find(modes.begin(), modes.end(), o.mode) != modes.end(), "--mode ", o.mode,
              " is not a schedule; use gpu, offload or layup");
  LAYUP_CHECK(o.cpu_workers >= 1, "--cpu-workers must be at least 1 (got ", o.cpu_workers, ")");
  parse_memory_budgets(o.memory_budget, o.device_budget, o.host_budget);  // throws naming the flag
}

nlohmann::json run_identity(const TrainOptions& o) {
  return {{"n_layer", o.model.n_layer},
          {"n_head", o.model.n_head},
          {"n_embd", o.model.n_embd},
          {"n_positions", o.model.n_positions},
          {"vocab_size", o.model.vocab_size},
          {"batch", o.batch},
          {"seq_len", o.seq_len},
          {"grad_accum", o.grad_accum},
          {"steps", o.steps},
          {"lr", o.lr},
          {"min_lr", o.min_lr},
          {"warmup_steps", o.warmup_steps},
          {"weight_decay", o.weight_decay},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"clip", o.clip},
          {"seed", o.seed}};
}

float parse_clip_flag(const std::string& text) {
  if (text == "none") return 0.0f;
  try {
    size_t used = 0;
    const float value = std::stof(text, &used);
    if (used == text.size() && value > 0.0f && std::isfinite(value)) return value;
  } catch (const std::exception&) {
  }
  fail("--clip takes a positive number or 'none' (got '", text, "')");
}

}  // namespace layup
