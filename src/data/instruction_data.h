// Instruction and chat data: the lines of a JSON Lines file as examples, and each example as
// token ids with per-token flags (data/token_flags.h), as the fine-tuning libraries tokenize them.
//
// A line of a .jsonl file is one example, in one of these forms (other fields of the line are
// ignored; blank lines are skipped):
//   plain text                          a line that does not start with '{': the line itself
//   {"text": "..."}                     a document
//   {"prompt": "...", "completion": "..."}
//   {"messages": [{"role": "...", "content": "..."}, ...]}
//
// How each becomes tokens (ExampleEncoder), following transformers and TRL's SFT trainer:
//   text          the tokenizer's document separator, then the text taken as text: what `layup
//                 tokenize` has always written, every token learned.
//   prompt/completion   tokenizer(prompt + completion + EOS) as transformers' tokenizer() gives
//                 it: special tokens recognised, and the tokens of tokenizer.json's post-processor
//                 around it (Llama 3's BOS in front; transformers ignores tokenizer_config.json's
//                 add_bos_token / add_eos_token where there is a tokenizer.json). The EOS text is
//                 appended unless the completion already ends with it (TRL's rule). Learned: the
//                 ids after the first len(tokenizer(prompt)) (TRL's completion mask).
//   messages      apply_chat_template(messages, tokenize=True): the model's chat template
//                 rendered, its text tokenized with special tokens recognised and nothing added.
//                 Learned: each assistant turn, the ids from len(tokens of the conversation
//                 before it, rendered with add_generation_prompt) to len(tokens of the
//                 conversation up to and including it) (the prefix rule of open-instruct and
//                 TRL's data collators): its content and the template's end-of-turn tokens.
// With LearnTokens::kAll every token is learned; text lines are always learned whole. The first
// token of every example is flagged as its start.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/run_choices.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace layup {

struct InstructionExample {
  enum class Kind { kText, kPromptCompletion, kChat };
  Kind kind = Kind::kText;
  std::string text;                   // kText
  std::string prompt, completion;     // kPromptCompletion
  std::vector<ChatMessage> messages;  // kChat
  size_t line = 0;                    // its line in a .jsonl file, from 1; 0 for a whole file
};

// One line of a .jsonl file (not blank). `where` ("data.jsonl: line 3") begins the message of the
// layup::Error thrown for a line that is not one of the forms above, which says what is wrong.
InstructionExample parse_example_line(std::string_view line, const std::string& where);

// The examples of a .jsonl file's `text`, one per line that is not blank; `path` names the file in
// errors, with the line number. Refuses a file without a single example.
std::vector<InstructionExample> parse_jsonl_examples(std::string_view text,
                                                     const std::string& path);

// Whether an example is instruction data: its tokens carry a learn mask worth a flags file.
inline bool is_instruction(const InstructionExample& example) {
  return example.kind != InstructionExample::Kind::kText;
}

// Which tokens of instruction examples the loss learns (`--learn`).
enum class LearnTokens {
  kCompletions,  // the completion of prompt/completion lines, the assistant turns of chat lines
  kAll,          // every token
};
inline constexpr EnumNames<LearnTokens, 2> kLearnTokensNames = {
    {{LearnTokens::kCompletions, "completions"}, {LearnTokens::kAll, "all"}}};
inline std::string name_of(LearnTokens learn) {
  return name_in(kLearnTokensNames, learn);
}

// What tokenizing instruction examples needs beyond the tokenizer, from its tokenizer_config.json.
struct InstructionTokenizerConfig {
  std::string bos_token, eos_token;          // the special tokens' text; empty where there is none
  std::optional<std::string> chat_template;  // the template's text
  std::string source;                        // the file(s) read, for messages
};

// The configuration beside the tokenizer at `tokenizer_path` (a folder, or a tokenizer.json whose
// folder is read): tokenizer_config.json and chat_template.jinja (which transformers prefers to
// the config's "chat_template") where they exist. A folder with GPT-2's own files and no config
// gets GPT-2's: <|endoftext|> for both tokens. Throws layup::Error for a file that is not valid.
InstructionTokenizerConfig read_instruction_tokenizer_config(const std::string& tokenizer_path);

// The files read_instruction_tokenizer_config reads, for keying the token caches they decide.
std::vector<std::string> instruction_tokenizer_config_files(const std::string& tokenizer_path);

// Tokens and flags of examples, appended to `ids` and `flags` (one flag byte per id).
class ExampleEncoder {
 public:
  // Renders a conversation with the chat template (add_generation_prompt as given).
  using ChatRenderer =
      std::function<std::string(std::span<const ChatMessage>, bool add_generation_prompt)>;

  // `tokenizer` must outlive the encoder. Chat lines are rendered with config.chat_template; a
  // config without one, or with one the renderer refuses, is refused only when a chat line comes.
  ExampleEncoder(const Tokenizer& tokenizer, const InstructionTokenizerConfig& config,
                 LearnTokens learn);
  // With a renderer of one's own (tests).
  ExampleEncoder(const Tokenizer& tokenizer, const InstructionTokenizerConfig& config,
                 LearnTokens learn, ChatRenderer render_chat);

  // `where` names the example in errors ("data.jsonl: line 3").
  void encode(const InstructionExample& example, const std::string& where,
              std::vector<int32_t>& ids, std::vector<uint8_t>& flags) const;

  // What transformers' tokenizer(text) gives: special tokens recognised, BOS/EOS per the config.
  std::vector<int32_t> tokenize_like_transformers(std::string_view text) const;
  // The ids of text with special tokens recognised and nothing added (apply_chat_template's).
  std::vector<int32_t> tokenize_special(std::string_view text) const;

 private:
  void encode_chat(const InstructionExample& example, const std::string& where,
                   std::vector<int32_t>& ids, std::vector<uint8_t>& flags) const;

  const Tokenizer& tokenizer_;
  InstructionTokenizerConfig config_;
  LearnTokens learn_;
  ChatRenderer render_chat_;
  std::string template_error_;  // why the config's chat template was refused, if it was
};

}  // namespace layup
