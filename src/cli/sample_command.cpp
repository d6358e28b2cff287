// `layup sample`: generate text from a checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/run_composer.h"
#include "io/checkpoint.h"
#include "sample/generate.h"
#include "tokenizer/tokenizer.h"
#include "train/corpus_shards.h"

namespace layup {

namespace {

struct SampleFlags {
  std::string checkpoint;
  std::string tokenizer;
  std::string prompt = "\n";
  SamplingOptions sampling{200, 0.8f, 40};
  uint64_t seed = 1;
};

}  // namespace

void add_sample_command(CLI::App& app) {
  auto flags = std::make_shared<SampleFlags>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  add_path_flag(*cmd, "--checkpoint", flags->checkpoint, "checkpoint or run folder",
                "A checkpoint folder (model.safetensors + config.json, e.g. from Hugging Face "
                "save_pretrained) or a run folder (its latest checkpoint)")
      ->required();
  add_text_flag(*cmd, "--prompt", flags->prompt, "text", "Text to continue")
      ->default_str("a newline");
  add_whole_flag(*cmd, "--tokens", flags->sampling.new_tokens, at_least(1), "Tokens to generate")
      ->capture_default_str();
  add_real_flag(*cmd, "--temperature", flags->sampling.temperature, positive_real(),
                "Sampling temperature")
      ->capture_default_str();
  add_whole_flag(*cmd, "--top-k", flags->sampling.top_k, at_least(0),
                 "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  add_seed_flag(*cmd, flags->seed, "Sampling seed");
  add_path_flag(*cmd, "--tokenizer", flags->tokenizer, "folder or tokenizer.json",
                "A tokenizer.json, or a folder with one or with GPT-2's gpt2.tiktoken or "
                "encoder.json + vocab.bpe")
      ->default_str("the checkpoint's tokenizer.json, else shipped");
  cmd->callback([flags]() {
    const uint64_t seed = flags->seed;
    const SamplingOptions& sampling = flags->sampling;
    const std::string checkpoint = find_latest_checkpoint(flags->checkpoint);
    namespace fs = std::filesystem;
    std::string tokenizer_dir = flags->tokenizer;
    if (tokenizer_dir.empty())
      tokenizer_dir = fs::exists(fs::path(checkpoint) / "tokenizer.json")
                          ? checkpoint
                          : (fs::path(shipped_data_dir()) / "gpt2-tokenizer").string();
    const std::unique_ptr<Tokenizer> tokenizer_owner = load_tokenizer(tokenizer_dir);
    const Tokenizer& tokenizer = *tokenizer_owner;
    const LoadedModel model = load_hf_model(checkpoint);
    const ModelConfig& config = model.config;
    std::vector<int32_t> prompt = tokenizer.encode(flags->prompt);
    if (prompt.empty()) prompt.push_back(tokenizer.document_separator());
    // A model may have fewer tokens than its tokenizer; an id beyond them has no embedding row.
    for (size_t i = 0; i < prompt.size(); ++i) {
      LAYUP_CHECK(prompt[i] < config.vocab_size, "--prompt: its token ", i, " (id ", prompt[i],
                  ") is outside the model's vocabulary of ", config.vocab_size,
                  " tokens; use a prompt of text this model was trained on, or the tokenizer it "
                  "was trained with (--tokenizer)");
    }

    const ParameterLayout layout(config);
    // The backend holds activations for the longest sequence it will see, not for the whole
    // context of a model made for 128k positions.
    const int context =
        static_cast<int>(std::min<size_t>(config.n_positions, prompt.size() + sampling.new_tokens));
    // Ids the tokenizer can spell: a model's vocabulary may be padded beyond its tokenizer's.
    const int vocab = std::min(config.vocab_size, tokenizer.vocab_size());
    const SamplingRun run = build_sampling_run(config, context);
    ModelBackend& backend = *run.compute.backend;
    const ParameterPointers params = layout.pointers<const float>(model.params.data());
    Rng rng(seed);
    const std::vector<int32_t> tokens = generate(
        [&](const TokenBatch& batch) {
          backend.forward(params, batch);
          return backend.logits();
        },
        prompt, context, vocab, config.padded_vocab_size, flags->sampling, rng);
    std::printf("%s\n", tokenizer.decode(tokens).c_str());
  });
}

}  // namespace layup
