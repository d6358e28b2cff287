// Checks of `layup train`'s options.
#include "train/train_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>

#include "core/error.h"
#include "memory/memory_plan.h"
#include "memory/place_override.h"
#include "model/shape_limits.h"
#include "schedule/schedule.h"

namespace layup {

void validate_train_options(const TrainOptions& o) {
  validate_config(o.model);
  LAYUP_CHECK(o.batch >= 1, "--batch must be at least 1 (got ", o.batch, ")");
  LAYUP_CHECK(o.seq_len >= 1, "--seq-len must be at least 1 (got ", o.seq_len, ")");
  check_seq_len_fits(o.seq_len, o.model);
  // The model's sizes before anything is laid out; the batch's in plan_run, with what fits.
  check_shape_limits(o.model, 1, o.seq_len);
  LAYUP_CHECK(o.grad_accum >= 1, "--grad-accum must be at least 1 (got ", o.grad_accum, ")");
  LAYUP_CHECK(o.steps >= 1, "--steps must be at least 1 (got ", o.steps, ")");
  LAYUP_CHECK(o.until_step == -1 || (o.until_step >= 1 && o.until_step <= o.steps), "--until-step ",
              o.until_step, " must lie between 1 and --steps ", o.steps);
  for (const auto& [flag, value] : {std::pair{"--lr", o.lr},
                                    {"--min-lr", o.min_lr},
                                    {"--weight-decay", o.weight_decay},
                                    {"--beta1", o.beta1},
                                    {"--beta2", o.beta2},
                                    {"--eps", o.eps},
                                    {"--clip", o.clip},
                                    {"--temperature", o.temperature}})
    LAYUP_CHECK(std::isfinite(value), flag, " must be a finite number (got ", value, ")");
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
  LAYUP_CHECK(o.log_every >= 1, "--log-every must be at least 1 (got ", o.log_every, ")");
  LAYUP_CHECK(o.checkpoint_every >= 0, "--checkpoint-every must not be negative");
  LAYUP_CHECK(o.keep_checkpoints >= 1, "--keep-checkpoints must be at least 1");
  LAYUP_CHECK(o.checkpoint_shard_mb >= 1, "--checkpoint-shard-mb must be at least 1 (got ",
              o.checkpoint_shard_mb, ")");
  LAYUP_CHECK(o.sample_tokens >= 0, "--sample-tokens must not be negative");
  LAYUP_CHECK(o.temperature > 0.0f, "--temperature must be positive (got ", o.temperature, ")");
  LAYUP_CHECK(o.top_k >= 0, "--top-k must not be negative (0 = the whole vocabulary)");
  check_thread_count("--cpu-workers", o.cpu_workers);
}

// The saved settings name each choice as its flag does ("layup", "bf16"); a name the table does not
// know reads as a damaged setting.
template <class Enum, size_t N>
void to_json_named(nlohmann::json& json, const EnumNames<Enum, N>& names, Enum value) {
  json = name_in(names, value);
}
template <class Enum, size_t N>
void from_json_named(const nlohmann::json& json, const EnumNames<Enum, N>& names, Enum& value) {
  value = parse_in(names, json.get<std::string>(), "a saved setting");
}
#define LAYUP_JSON_ENUM(Enum, names)                        \
  void to_json(nlohmann::json& json, Enum value) {          \
    to_json_named(json, names, value);                      \
  }                                                         \
  void from_json(const nlohmann::json& json, Enum& value) { \
    from_json_named(json, names, value);                    \
  }
LAYUP_JSON_ENUM(Mode, kModeNames)
LAYUP_JSON_ENUM(DeviceKind, kDeviceNames)
LAYUP_JSON_ENUM(Dtype, kDtypeNames)
LAYUP_JSON_ENUM(LayupClip, kLayupClipNames)
LAYUP_JSON_ENUM(LayupHead, kLayupHeadNames)
LAYUP_JSON_ENUM(AlgorithmChoice, kAlgorithmChoiceNames)
LAYUP_JSON_ENUM(CheckpointContents, kCheckpointContentsNames)
LAYUP_JSON_ENUM(WeightsDtype, kWeightsDtypeNames)
LAYUP_JSON_ENUM(OptimizerStateKind, kOptimizerStateKindNames)
LAYUP_JSON_ENUM(Accumulation, kAccumulationNames)
LAYUP_JSON_ENUM(LearnTokens, kLearnTokensNames)
#undef LAYUP_JSON_ENUM

// A --place override is saved as the flag writes it ("grads=pinned"), and parsed as it is read.
void to_json(nlohmann::json& json, const PlaceOverride& place) {
  json = place.name();
}
void from_json(const nlohmann::json& json, PlaceOverride& place) {
  place = PlaceOverride::parse(json.get<std::string>());
}

void check_seq_len_fits(int seq_len, const ModelConfig& model) {
  LAYUP_CHECK(seq_len <= model.n_positions, "--seq-len ", seq_len,
              " is above the model's context of ", model.n_positions, " positions; use --seq-len ",
              model.n_positions, " or less, or a --context of ", seq_len, " or more");
}

namespace {

// One setting a checkpoint keeps: its key in the saved JSON, the flag that sets it, whether it
// changes the trajectory (the parameters after a step), and how it is read and written.
struct Setting {
  const char* key;
  const char* flag;
  bool trajectory;
  nlohmann::json (*get)(const TrainOptions&);
  void (*set)(TrainOptions&, const nlohmann::json&);
};

#define LAYUP_SETTING(key, flag, trajectory, field)                                       \
  Setting {                                                                               \
    key, flag, trajectory, [](const TrainOptions& o) { return nlohmann::json(o.field); }, \
        [](TrainOptions& o, const nlohmann::json& value) { value.get_to(o.field); }       \
  }

// The model's sizes come from the checkpoint's config.json; they are kept here too so a run's
// settings read whole.
const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      LAYUP_SETTING("n_layer", "--layers", true, model.n_layer),
      LAYUP_SETTING("n_head", "--heads", true, model.n_head),
      LAYUP_SETTING("n_embd", "--dim", true, model.n_embd),
      LAYUP_SETTING("n_positions", "--context", true, model.n_positions),
      LAYUP_SETTING("vocab_size", "", true, model.vocab_size),
      LAYUP_SETTING("model_name", "--model", false, model_name),
      LAYUP_SETTING("batch", "--batch", true, batch),
      LAYUP_SETTING("seq_len", "--seq-len", true, seq_len),
      LAYUP_SETTING("grad_accum", "--grad-accum", true, grad_accum),
      LAYUP_SETTING("steps", "--steps", true, steps),
      LAYUP_SETTING("lr", "--lr", true, lr),
      LAYUP_SETTING("min_lr", "--min-lr", true, min_lr),
      LAYUP_SETTING("warmup_steps", "--warmup", true, warmup_steps),
      LAYUP_SETTING("weight_decay", "--weight-decay", true, weight_decay),
      LAYUP_SETTING("beta1", "--beta1", true, beta1),
      LAYUP_SETTING("beta2", "--beta2", true, beta2),
      LAYUP_SETTING("eps", "--eps", true, eps),
      LAYUP_SETTING("clip", "--clip", true, clip),
      // A run saved before kinds existed has none: fp32, or whatever --optimizer-state asks for
      // (its moments are then coded into that kind when the run resumes).
      LAYUP_SETTING("optimizer_state", "--optimizer-state", true, optimizer_state),
      LAYUP_SETTING("seed", "--seed", true, seed),
      LAYUP_SETTING("data_dir", "--data", true, data_dir),
      LAYUP_SETTING("learn", "--learn", true, learn),
      LAYUP_SETTING("pack_examples", "--no-packing", true, pack_examples),
      LAYUP_SETTING("tokenizer_dir", "--tokenizer", false, tokenizer_dir),
      LAYUP_SETTING("eval_every", "--eval-every", false, eval_every),
      LAYUP_SETTING("eval_batches", "--eval-batches", false, eval_batches),
      LAYUP_SETTING("checkpoint_every", "--checkpoint-every", false, checkpoint_every),
      LAYUP_SETTING("keep_checkpoints", "--keep-checkpoints", false, keep_checkpoints),
      LAYUP_SETTING("checkpoint_contents", "--checkpoint-contents", false, checkpoint_contents),
      LAYUP_SETTING("checkpoint_shard_mb", "--checkpoint-shard-mb", false, checkpoint_shard_mb),
      LAYUP_SETTING("save_dtype", "--save-dtype", false, save_dtype),
      LAYUP_SETTING("log_every", "--log-every", false, log_every),
      LAYUP_SETTING("sample_tokens", "--sample-tokens", false, sample_tokens),
      LAYUP_SETTING("sample_prompt", "--prompt", false, sample_prompt),
      LAYUP_SETTING("temperature", "--temperature", false, temperature),
      LAYUP_SETTING("top_k", "--top-k", false, top_k),
      LAYUP_SETTING("mode", "--mode", false, mode),
      LAYUP_SETTING("layup_clip", "--layup-clip", false, layup_clip),
      LAYUP_SETTING("layup_head", "--layup-head", false, layup_head),
      LAYUP_SETTING("accumulation", "--accumulate", false, accumulation),
      LAYUP_SETTING("recompute", "--recompute", false, recompute),
      LAYUP_SETTING("algorithms", "--algorithms", false, algorithms),
      LAYUP_SETTING("place", "--place", false, place),
  };
  return table;
}

#undef LAYUP_SETTING

bool given(const TrainOptions& options, const char* flag) {
  return *flag != '\0' && std::find(options.given_flags.begin(), options.given_flags.end(), flag) !=
                              options.given_flags.end();
}

}  // namespace

void clamp_default_warmup(TrainOptions& options) {
  if (!given(options, "--warmup"))
    options.warmup_steps = std::min(options.warmup_steps, options.steps);
}

nlohmann::json run_settings(const TrainOptions& o) {
  nlohmann::json saved = nlohmann::json::object();
  for (const Setting& setting : settings()) saved[setting.key] = setting.get(o);
  return saved;
}

std::vector<NamedSetting> run_settings_in_order(const TrainOptions& o) {
  std::vector<NamedSetting> named;
  for (const Setting& setting : settings())
    named.push_back({setting.key, setting.flag, setting.get(o)});
  return named;
}

TrainOptions resume_settings(TrainOptions options, const nlohmann::json& saved,
                             const std::string& checkpoint, std::vector<std::string>& notes) {
  for (const Setting& setting : settings()) {
    if (!saved.contains(setting.key)) continue;
    const nlohmann::json& value = saved[setting.key];
    const nlohmann::json wanted = setting.get(options);
    if (!given(options, setting.flag)) {
      try {
        setting.set(options, value);
      } catch (const std::exception&) {  // nlohmann's, or an unknown name (layup::Error)
        fail("the checkpoint ", checkpoint, " saved the setting ", setting.key, " as ",
             value.dump(), ", which is not a valid value for ", setting.flag,
             "; the file has been changed or damaged");
      }
      continue;
    }
    if (wanted == value || !setting.trajectory) continue;
    if (std::string(setting.key) == "data_dir") {
      notes.push_back("--data " + wanted.get<std::string>() + " replaces the run's data folder " +
                      value.get<std::string>() +
                      ": batches continue from the sampler's saved state over it, so the run "
                      "goes on as before only if it holds the same tokens");
      continue;
    }
    if (std::string(setting.key) == "steps") {
      notes.push_back("--steps " + wanted.dump() + " changes the run's length from " +
                      value.dump() +
                      " steps: the learning-rate schedule's cosine now ends at step " +
                      wanted.dump() + ", so the steps from here on differ from the original run's");
      continue;
    }
    fail("cannot resume ", checkpoint, " with ", setting.flag, " ", setting_text(wanted),
         ": the run was trained with ", setting_text(value),
         ", and a different value would change its trajectory. "
         "Drop the flag to continue the run as it was, or start a new run (--out elsewhere)");
  }
  return options;
}

std::string setting_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) {
    const double number = value.get<double>();
    const float single = static_cast<float>(number);
    char text[32];
    const auto [end, error] = std::to_chars(text, text + sizeof text, single);
    if (static_cast<double>(single) == number && error == std::errc())
      return std::string(text, end);
  }
  return value.dump();
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
