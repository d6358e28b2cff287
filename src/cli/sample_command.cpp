// `layup sample`: generate text from a checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/rng.h"
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
  cmd->add_option("--checkpoint", flags->checkpoint,
                  "A checkpoint folder (model.safetensors + config.json, e.g. from Hugging Face "
                  "save_pretrained) or a run folder (its latest checkpoint)")
      ->required();
  cmd->add_option("--prompt", flags->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", flags->sampling.new_tokens, "Tokens to generate")
      ->capture_default_str();
  cmd->add_option("--temperature", flags->sampling.temperature, "Sampling temperature")
      ->capture_default_str();
  cmd->add_option("--top-k", flags->sampling.top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  add_seed_flag(*cmd, flags->seed, "Sampling seed");
  cmd->add_option("--tokenizer", flags->tokenizer,
                  "A tokenizer.json, or a folder with one or with GPT-2's gpt2.tiktoken or "
                  "encoder.json + vocab.bpe (default: the checkpoint's tokenizer.json if it has "
                  "one, else the shipped GPT-2 one)");
  cmd->callback([flags]() {
    const uint64_t seed = flags->seed;
    const SamplingOptions& sampling = flags->sampling;
    LAYUP_CHECK(sampling.new_tokens >= 1,
                "--tokens must be at least 1 (the number of tokens to generate), got ",
                sampling.new_tokens);
    LAYUP_CHECK(std::isfinite(sampling.temperature) && sampling.temperature > 0.0f,
                "--temperature must be a positive finite number (1 samples the model's "
                "distribution as it is, lower values make the text more predictable), got ",
                sampling.temperature);
    LAYUP_CHECK(sampling.top_k >= 0,
                "--top-k must be 0 (sample from the whole vocabulary) or a positive number of "
                "likeliest tokens, got ",
                sampling.top_k);
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
    std::unique_ptr<ModelBackend> backend = make_cpu_backend(config, 1, context);
    const ParameterPointers params = layout.pointers<const float>(model.params.data());
    Rng rng(seed);
    const std::vector<int32_t> tokens = generate(
        [&](const TokenBatch& batch) {
          backend->forward(params, batch);
          return backend->logits();
        },
        prompt, context, vocab, config.padded_vocab_size, flags->sampling, rng);
    std::printf("%s\n", tokenizer.decode(tokens).c_str());
  });
}

}  // namespace layup
