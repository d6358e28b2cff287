// `layup sample`: generate text from a checkpoint. The prompt is spelled as transformers spells
// it (BOS where the tokenizer's config adds one; --chat through the model's chat template), the
// memory is planned and checked before anything is allocated, generation runs on a key/value
// cache (or, with --no-kv-cache, recomputes the window) and stops at the tokenizer's EOS or a
// --stop text; prefill and decode speeds go to stderr, the text to stdout.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/backend_factory.h"
#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "memory/host_memory.h"
#include "sample/generate.h"
#include "sample/sample_memory.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "train/corpus_shards.h"

namespace layup {

namespace {

namespace fs = std::filesystem;

struct SampleFlags {
  std::string checkpoint;
  std::string tokenizer;
  std::string prompt = "\n";
  SamplingOptions sampling{200, 0.8f, 40};
  uint64_t seed = 1;
  std::vector<std::string> stop;
  std::vector<int32_t> prompt_ids;  // instead of --prompt: the ids as they are
  bool chat = false, no_bos = false, ignore_eos = false, no_kv_cache = false;
  DeviceKind device = DeviceKind::kCpu;
  Dtype dtype = Dtype::kAuto;
  int threads = 0;
};

// The cache's prefill goes in pieces of this many tokens at most: the backend is sized for one
// piece, whatever the prompt's length.
constexpr int kPromptPieceTokens = 128;

// A JSON file of the tokenizer's or the model's folder; null where there is none.
nlohmann::json read_json_if_present(const fs::path& path) {
  if (!fs::exists(path)) return nullptr;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& error) {
    fail(path.string(), " is not valid JSON (", error.what(), "); the file is damaged");
  }
}

// A special token as tokenizer_config.json names it: its text, or {"content": text}.
std::string special_token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return "";
}

// The ids that end generation: generation_config.json's eos_token_id where the checkpoint has
// one (transformers' generate reads it), else config.json's; an id or a list.
std::vector<int32_t> eos_token_ids(const std::string& checkpoint) {
  const fs::path generation = fs::path(checkpoint) / kHfGenerationConfigFileName;
  nlohmann::json ids;
  if (fs::exists(generation)) ids = read_hf_config_extras(generation.string()).eos_token_id;
  if (ids.is_null())
    ids = read_hf_config_extras((fs::path(checkpoint) / kHfConfigFileName).string()).eos_token_id;
  std::vector<int32_t> result;
  if (ids.is_number_integer()) result.push_back(ids.get<int32_t>());
  if (ids.is_array())
    for (const nlohmann::json& id : ids) result.push_back(id.get<int32_t>());
  return result;
}

// The ids transformers' tokenizer(prompt) puts before the text: the tokens tokenizer.json's
// post-processor template puts there (Llama 3's <|begin_of_text|>, Llama 2's and Mistral's <s>).
// transformers (5.x) does not read tokenizer_config.json's add_bos_token where a tokenizer.json
// exists, so neither does layup. GPT-2's own files (not a tokenizer.json) add nothing.
std::vector<int32_t> bos_ids(const Tokenizer& tokenizer) {
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  if (!hf) return {};
  // The post-processor's tokens before a text: where the text's own ids start in what it makes.
  const std::vector<int32_t> text = hf->encode("a", {});
  const std::vector<int32_t> with = hf->encode("a", {.add_post_processor_tokens = true});
  const auto start = std::search(with.begin(), with.end(), text.begin(), text.end());
  return std::vector<int32_t>(with.begin(), start);
}

// The prompt's ids: as one user message through the model's chat template (--chat), or the text
// with BOS before it; special tokens' spellings become their ids, as in transformers.
std::vector<int32_t> prompt_ids(const SampleFlags& flags, const Tokenizer& tokenizer,
                                const fs::path& tokenizer_config_path) {
  if (!flags.prompt_ids.empty()) {
    LAYUP_CHECK(!flags.chat,
                "--chat renders the text of --prompt; --prompt-ids are given as they "
                "are: use one of them");
    return flags.prompt_ids;
  }
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  const nlohmann::json tokenizer_config = read_json_if_present(tokenizer_config_path);
  if (!flags.chat) {
    std::vector<int32_t> ids = flags.no_bos ? std::vector<int32_t>() : bos_ids(tokenizer);
    const std::vector<int32_t> text =
        hf ? hf->encode(flags.prompt, {.recognize_special_tokens = true})
           : tokenizer.encode(flags.prompt);
    ids.insert(ids.end(), text.begin(), text.end());
    return ids;
  }
  LAYUP_CHECK(hf,
              "--chat needs the model's tokenizer.json and tokenizer_config.json (GPT-2's own "
              "files have no chat template); drop --chat, or give --tokenizer");
  // chat_template.jinja beside the config is read first, and may be there without one.
  const bool has_template_file =
      fs::is_regular_file(tokenizer_config_path.parent_path() / "chat_template.jinja");
  const std::optional<std::string> source =
      has_template_file || fs::exists(tokenizer_config_path)
          ? chat_template_from_config(tokenizer_config_path.string())
          : std::nullopt;
  LAYUP_CHECK(source.has_value(), "--chat: ", tokenizer_config_path.string(),
              fs::exists(tokenizer_config_path) ? " has no chat_template" : " does not exist",
              " and there is no chat_template.jinja beside it; this model has no chat template, "
              "drop --chat");
  ChatTemplateContext context;
  context.bos_token = special_token_text(tokenizer_config.value("bos_token", nlohmann::json()));
  context.eos_token = special_token_text(tokenizer_config.value("eos_token", nlohmann::json()));
  context.add_generation_prompt = true;
  const ChatMessage message{"user", flags.prompt};
  const std::string rendered =
      ChatTemplate(*source).render(std::span<const ChatMessage>(&message, 1), context);
  // apply_chat_template tokenizes with add_special_tokens=False: the template spells BOS itself.
  return hf->encode(rendered, {.recognize_special_tokens = true});
}

// The weights where the backend reads them: the host's on the CPU; on CUDA in fp32 a copy on the
// GPU, in bf16 straight into the backend's compute copy through a staging buffer (no fp32 copy on
// the GPU), the host's pointers then standing for spans the backend no longer reads.
struct PlacedWeights {
  DeviceBuffer buffer;
  ParameterPointers pointers;
};
PlacedWeights place_weights(BackendAndDevice& compute, const ComputeTarget& target,
                            const ParameterLayout& layout, const std::vector<float>& params) {
  PlacedWeights placed;
  placed.pointers = layout.pointers<const float>(params.data());
  if (target.device == DeviceKind::kCpu) return placed;
  Device& device = *compute.device;
  if (target.dtype == Dtype::kFp32) {
    placed.buffer = device.allocate(params.size(), TensorClass::kWeights);
    device.copy_to_device(placed.buffer.data(), params.data(), params.size());
    placed.pointers = layout.pointers<const float>(placed.buffer.data());
    return placed;
  }
  const DeviceBuffer staging = device.allocate(kSampleStagingFloats, TensorClass::kScratch);
  std::mutex mutex;
  std::condition_variable all_landed;
  size_t landed = 0;
  const std::vector<Span>& spans = layout.spans();
  for (size_t i = 0; i < spans.size(); ++i)
    device.copy_to_compute_copy_async(compute.backend->compute_copy(i),
                                      params.data() + spans[i].offset, spans[i].count,
                                      staging.data(), kSampleStagingFloats, [&] {
                                        std::lock_guard<std::mutex> lock(mutex);
                                        ++landed;
                                        all_landed.notify_one();
                                      });
  std::unique_lock<std::mutex> lock(mutex);
  all_landed.wait(lock, [&] { return landed == spans.size(); });
  compute.backend->set_compute_copies_current(true);
  return placed;
}

const char* stop_reason_text(StopReason reason) {
  switch (reason) {
    case StopReason::kTokenLimit:
      return "--tokens reached";
    case StopReason::kStopToken:
      return "end-of-sequence token";
    case StopReason::kStopText:
      return "--stop text";
    case StopReason::kContextFull:
      return "the model's context (or attention window) is full: the key/value cache cannot "
             "slide; --no-kv-cache slides the window instead";
  }
  return "";
}

double tokens_per_s(int tokens, double seconds) {
  return seconds > 0 ? tokens / seconds : 0.0;
}

void run_sample(const SampleFlags& flags) {
  apply_threads_flag(flags.threads);
  const std::string checkpoint = find_latest_checkpoint(flags.checkpoint);
  std::string tokenizer_path = flags.tokenizer;
  if (tokenizer_path.empty())
    tokenizer_path = fs::exists(fs::path(checkpoint) / "tokenizer.json")
                         ? checkpoint
                         : (fs::path(shipped_data_dir()) / "gpt2-tokenizer").string();
  const std::unique_ptr<Tokenizer> tokenizer_owner = load_tokenizer(tokenizer_path);
  const Tokenizer& tokenizer = *tokenizer_owner;
  const fs::path tokenizer_dir = fs::is_directory(tokenizer_path)
                                     ? fs::path(tokenizer_path)
                                     : fs::path(tokenizer_path).parent_path();
  const ModelConfig config = read_hf_config((fs::path(checkpoint) / kHfConfigFileName).string());

  std::vector<int32_t> prompt =
      prompt_ids(flags, tokenizer, tokenizer_dir / "tokenizer_config.json");
  if (prompt.empty()) prompt.push_back(tokenizer.document_separator());
  // A model may have fewer tokens than its tokenizer; an id beyond them has no embedding row.
  for (size_t i = 0; i < prompt.size(); ++i) {
    LAYUP_CHECK(prompt[i] >= 0 && prompt[i] < config.vocab_size,
                flags.prompt_ids.empty() ? "--prompt" : "--prompt-ids", ": its token ", i, " (id ",
                prompt[i], ") is outside the model's vocabulary of ", config.vocab_size,
                " tokens; use a prompt of text this model was trained on, or the tokenizer it "
                "was trained with (--tokenizer)");
  }

  const ComputeTarget target = resolve_compute_target({flags.device, flags.dtype});
  const bool kv_cache = !flags.no_kv_cache;
  // The longest sequence: the prompt and the new tokens, within the model's context, and within
  // Mistral's sliding_window (layup's attention sees every earlier position: the model's own
  // attention only inside the window). Without a cache the backend holds activations for all of
  // it (not for 128k positions of a model made for them); with one, for a piece of the prompt.
  const int context = config.sliding_window > 0
                          ? std::min(config.n_positions, config.sliding_window)
                          : config.n_positions;
  const int positions =
      static_cast<int>(std::min<size_t>(context, prompt.size() + flags.sampling.new_tokens));
  const int piece = kv_cache ? std::min(positions, kPromptPieceTokens) : positions;
  const SampleMemoryPlan plan = plan_sample_memory(
      {config, target.device, target.dtype == Dtype::kBf16, positions, piece, kv_cache});
  const HostMemoryLimit host = read_host_memory_limit();
  check_sample_memory(
      plan, host.usable_bytes(), host.describe(),
      target.device == DeviceKind::kCuda ? memory_attributes_of(DeviceKind::kCuda).free_bytes : 0);
  std::fprintf(stderr, "sample: %s in %s, %s; memory: %s\n", name_of(target.device).c_str(),
               name_of(target.dtype).c_str(),
               kv_cache ? "key/value cache" : "the window recomputed for every token",
               plan.describe().c_str());

  const LoadedModel model = load_hf_model(checkpoint);
  const ParameterLayout layout(model.config);
  BackendAndDevice compute = make_backend(target, model.config, 1, piece);
  const PlacedWeights weights = place_weights(compute, target, layout, model.params);
  ModelBackend& backend = *compute.backend;
  std::unique_ptr<NextTokenModel> next;
  if (kv_cache) {
    next = std::make_unique<KvCacheModel>(backend, weights.pointers, positions, piece);
  } else {
    next = std::make_unique<RecomputeModel>(
        [&](const TokenBatch& batch) {
          backend.forward(weights.pointers, batch);
          return backend.logits();
        },
        positions, config.padded_vocab_size);
  }

  StopConditions stop;
  if (!flags.ignore_eos) stop.token_ids = eos_token_ids(checkpoint);
  stop.texts = flags.stop;
  stop.decode = [&](std::span<const int32_t> ids) { return tokenizer.decode(ids); };
  // Ids the tokenizer can spell: a model's vocabulary may be padded beyond its tokenizer's.
  const int vocab = std::min(config.vocab_size, tokenizer.vocab_size());
  Rng rng(flags.seed);
  const GenerationResult result = generate(*next, prompt, vocab, flags.sampling, stop, rng);

  // --chat prints the reply; otherwise the prompt and its continuation, as they read together.
  std::vector<int32_t> shown = flags.chat ? std::vector<int32_t>() : prompt;
  shown.insert(shown.end(), result.tokens.begin(), result.tokens.end());
  std::printf("%s\n", tokenizer.decode(shown).c_str());
  // The first new token comes from the prompt's forward; each later one from a forward of its own.
  const int prefilled = std::min(static_cast<int>(prompt.size()), positions);
  const int decoded = std::max(0, static_cast<int>(result.tokens.size()) - 1);
  std::fprintf(stderr,
               "prefill: %d tokens in %.3f s (%.1f tokens/s); decode: %d tokens in %.3f s (%.1f "
               "tokens/s); stopped: %s\n",
               prefilled, result.prefill_seconds, tokens_per_s(prefilled, result.prefill_seconds),
               decoded, result.decode_seconds, tokens_per_s(decoded, result.decode_seconds),
               stop_reason_text(result.reason));
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto flags = std::make_shared<SampleFlags>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  add_path_flag(*cmd, "--checkpoint", flags->checkpoint, "checkpoint or run folder",
                "A checkpoint folder (model.safetensors + config.json, e.g. from Hugging Face "
                "save_pretrained) or a run folder (its latest checkpoint)")
      ->required();
  CLI::Option* prompt = add_text_flag(*cmd, "--prompt", flags->prompt, "text", "Text to continue")
                            ->default_str("a newline");
  cmd->add_option("--prompt-ids", flags->prompt_ids,
                  "Token ids to continue instead of --prompt, as they are (no BOS added): e.g. "
                  "the ids another engine is given, to compare with it")
      ->type_name("id,id,...")
      ->delimiter(',')
      ->check(whole_validator<int32_t>(shown_as(at_least(0), "a token id (an integer ≥ 0)")))
      ->excludes(prompt);
  add_whole_flag(*cmd, "--tokens", flags->sampling.new_tokens, at_least(1),
                 "Tokens to generate at most (fewer where an end-of-sequence token, a --stop text "
                 "or the model's context comes first)")
      ->capture_default_str();
  add_real_flag(*cmd, "--temperature", flags->sampling.temperature, positive_real(),
                "Sampling temperature")
      ->capture_default_str();
  add_whole_flag(*cmd, "--top-k", flags->sampling.top_k, at_least(0),
                 "Sample among the k likeliest tokens (0: all; 1: greedy)")
      ->capture_default_str();
  add_seed_flag(*cmd, flags->seed, "Sampling seed");
  add_path_flag(*cmd, "--tokenizer", flags->tokenizer, "folder or tokenizer.json",
                "A tokenizer.json, or a folder with one or with GPT-2's gpt2.tiktoken or "
                "encoder.json + vocab.bpe")
      ->default_str("the checkpoint's tokenizer.json, else shipped");
  cmd->add_option("--stop", flags->stop,
                  "Stop once the continuation contains this text (kept in the output); repeatable")
      ->type_name("text")
      ->allow_extra_args(false);
  cmd->add_flag("--chat", flags->chat,
                "Send --prompt as one user message through the model's chat template "
                "(tokenizer_config.json's chat_template) and print the reply only");
  cmd->add_flag("--no-bos", flags->no_bos,
                "Put no BOS token before the prompt (by default it gets one where tokenizer.json's "
                "post-processor puts one, as transformers does)");
  cmd->add_flag("--ignore-eos", flags->ignore_eos,
                "Go on past the end-of-sequence token (generation_config.json's or config.json's "
                "eos_token_id; by default generation stops there, the token not printed)");
  cmd->add_flag("--no-kv-cache", flags->no_kv_cache,
                "Recompute the whole window for every token instead of keeping keys and values "
                "(slower; past the context the window slides, where the cache stops)");
  add_device_flags(*cmd, flags->device, flags->dtype);
  add_threads_flag(*cmd, flags->threads);
  cmd->callback([flags]() { run_sample(*flags); });
}

}  // namespace layup
