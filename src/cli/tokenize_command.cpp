// `layup tokenize`: text and instruction files -> train/validation token shards (and flags).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "data/instruction_data.h"
#include "tokenizer/tokenizer.h"
#include "train/corpus_shards.h"

namespace layup {

namespace {

struct TokenizeFlags {
  std::vector<std::string> files;
  std::string out;
  std::string tokenizer;
  double val_fraction = 0.05;
  bool overwrite = false;
  LearnTokens learn = LearnTokens::kCompletions;
};

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Turn UTF-8 text files into token shards (llm.c's layouts: 256 int32 header, then uint16 "
      "token ids, or uint32 for a vocabulary over 65,536)");
  add_path_flag(*cmd, "files", flags->files, "file",
                "Text files, each one document, or JSON Lines files (.jsonl), an example per "
                "line: plain text, {\"text\": ...}, {\"prompt\": ..., \"completion\": ...} or "
                "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]} (rendered with the "
                "tokenizer folder's chat template). A file that looks binary (a NUL byte, or more "
                "than 10% of its bytes outside valid UTF-8) is tokenized with a warning")
      ->required();
  add_path_flag(*cmd, "--out", flags->out, "folder",
                "Folder for train_*.bin and val_*.bin (made if missing; nothing is written "
                "there if tokenizing fails)")
      ->required();
  add_real_flag(*cmd, "--val-fraction", flags->val_fraction,
                real_between(0, true, 1, true, "(0, 1)"),
                "Share of each document (its end, rounded down) kept for validation, in (0, 1)")
      ->capture_default_str();
  cmd->add_flag("--overwrite", flags->overwrite,
                "Replace the *.bin files already in --out (without it they are refused: layup "
                "would read them together with the new shards); they are removed only once "
                "every new shard is written");
  add_choice_option(
      *cmd, "--learn", flags->learn, kLearnTokensNames,
      "Which tokens of prompt/completion and chat lines the loss learns, written to a .flags "
      "file beside each shard: completions (the completion, the assistant turns) or all; "
      "text is always learned whole");
  add_path_flag(*cmd, "--tokenizer", flags->tokenizer, "folder or tokenizer.json",
                "Folder with GPT-2's gpt2.tiktoken or encoder.json + vocab.bpe, or with a Hugging "
                "Face tokenizer.json (byte-level BPE: Llama 3, Qwen2, SmolLM...), or that "
                "tokenizer.json itself, with its tokenizer_config.json (EOS, chat template) beside "
                "it. Special-token text in text documents is encoded as ordinary text; each "
                "document starts with the tokenizer's document separator (<|endoftext|>, or "
                "Llama 3's <|begin_of_text|>). Prompt/completion and chat lines are tokenized as "
                "transformers does, special tokens recognised")
      ->default_str("shipped");
  cmd->callback([flags]() {
    const std::string tokenizer_dir =
        flags->tokenizer.empty()
            ? (std::filesystem::path(shipped_data_dir()) / "gpt2-tokenizer").string()
            : flags->tokenizer;
    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_dir);
    const ExampleEncoding encoding{read_instruction_tokenizer_config(tokenizer_dir), flags->learn};
    const ShardSummary summary =
        write_corpus_shards(*tokenizer, flags->files, flags->out, flags->val_fraction,
                            flags->overwrite ? ExistingShards::kReplace : ExistingShards::kRefuse,
                            kTokensPerShard, encoding);
    if (summary.with_flags) {
      std::printf("%zu training tokens (%zu learned, --learn %s), %zu validation tokens\n",
                  summary.train_tokens, summary.train_learned_tokens, name_of(flags->learn).c_str(),
                  summary.val_tokens);
    } else {
      std::printf("%zu training tokens, %zu validation tokens\n", summary.train_tokens,
                  summary.val_tokens);
    }
    for (const std::string& file : summary.files) std::printf("  %s\n", file.c_str());
    if (!summary.removed.empty())
      std::printf("replaced the %zu older *.bin files of %s\n", summary.removed.size(),
                  flags->out.c_str());
  });
}

}  // namespace layup
