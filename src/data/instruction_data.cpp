// Instruction and chat examples: parsing JSON Lines, and tokenizing with learn/start flags.
#include "data/instruction_data.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/token_flags.h"
#include "tokenizer/hf_tokenizer.h"

namespace layup {

namespace fs = std::filesystem;

namespace {

constexpr const char* kForms =
    "a line holds plain text, or a JSON object with \"text\", with \"prompt\" and "
    "\"completion\", or with \"messages\": [{\"role\": ..., \"content\": ...}, ...]";

bool is_blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
  });
}

std::string shortened(std::string_view text) {
  return text.size() > 60 ? std::string(text.substr(0, 57)) + "..." : std::string(text);
}

const char* json_type(const nlohmann::json& value) {
  return value.type_name();
}

std::string string_field(const nlohmann::json& record, const char* key, const std::string& where) {
  const nlohmann::json& value = record.at(key);
  LAYUP_CHECK(value.is_string(), where, ": \"", key, "\" is ", json_type(value), ", not a string; ",
              kForms);
  return value.get<std::string>();
}

std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& where) {
  LAYUP_CHECK(messages.is_array(), where, ": \"messages\" is ", json_type(messages),
              ", not a list of {\"role\": ..., \"content\": ...} objects");
  LAYUP_CHECK(!messages.empty(), where,
              ": \"messages\" is an empty list; a chat example needs "
              "at least one message");
  std::vector<ChatMessage> parsed;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& message = messages[i];
    const std::string which = where + ": message " + std::to_string(i + 1);
    LAYUP_CHECK(message.is_object(), which, " is ", json_type(message),
                ", not a {\"role\": ..., \"content\": ...} object");
    for (const auto& [key, value] : message.items()) {
      // transformers drops fields whose value is null before rendering.
      LAYUP_CHECK(key == "role" || key == "content" || value.is_null(), which, " has the field \"",
                  key,
                  "\"; layup renders messages of \"role\" and \"content\" only (tool calls and "
                  "other fields would change what the template writes)");
    }
    LAYUP_CHECK(message.contains("role") && message["role"].is_string(), which,
                " has no \"role\" string");
    LAYUP_CHECK(message.contains("content") && message["content"].is_string(), which,
                message.contains("content") ? " has a \"content\" that is not a string (" +
                                                  std::string(json_type(message["content"])) +
                                                  "); layup takes text content only"
                                            : std::string(" has no \"content\""));
    parsed.push_back({message["role"].get<std::string>(), message["content"].get<std::string>()});
  }
  return parsed;
}

// The text of a special token in tokenizer_config.json: a string, or an AddedToken's object
// with its "content"; "" for null or absent.
std::string special_token_text(const nlohmann::json& config, const char* key,
                               const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const nlohmann::json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  LAYUP_CHECK(value.is_object() && value.contains("content") && value["content"].is_string(), path,
              ": \"", key, "\" is neither a string nor an object with a \"content\" string");
  return value["content"].get<std::string>();
}

fs::path tokenizer_folder(const std::string& tokenizer_path) {
  std::error_code ignored;
  return fs::is_directory(tokenizer_path, ignored) ? fs::path(tokenizer_path)
                                                   : fs::path(tokenizer_path).parent_path();
}

bool is_gpt2_folder(const fs::path& folder) {
  std::error_code ignored;
  return fs::exists(folder / "gpt2.tiktoken", ignored) ||
         (fs::exists(folder / "encoder.json", ignored) &&
          fs::exists(folder / "vocab.bpe", ignored));
}

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  LAYUP_CHECK(in, "cannot read ", path.string());
  std::ostringstream contents;
  contents << in.rdbuf();
  LAYUP_CHECK(!in.bad(), "cannot read ", path.string());
  return contents.str();
}

}  // namespace

InstructionExample parse_example_line(std::string_view line, const std::string& where) {
  const size_t first = line.find_first_not_of(" \t\r");
  InstructionExample example;
  if (first == std::string_view::npos || line[first] != '{') {
    // Not JSON: the line is a plain-text document.
    example.text = std::string(line.substr(0, line.find_last_not_of("\r") + 1));
    return example;
  }
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& error) {
    fail(where, ": the line starts with '{' but is not valid JSON (", error.what(),
         "): ", shortened(line), "; ", kForms);
  }
  const bool text = record.contains("text");
  const bool prompt = record.contains("prompt") || record.contains("completion");
  const bool chat = record.contains("messages");
  LAYUP_CHECK(text + prompt + chat == 1, where, ": ",
              text + prompt + chat == 0 ? "the object has none of \"text\", \"prompt\"/"
                                          "\"completion\" and \"messages\""
                                        : "the object has more than one of \"text\", "
                                          "\"prompt\"/\"completion\" and \"messages\"",
              " (", shortened(line), "); ", kForms);
  if (text) {
    example.text = string_field(record, "text", where);
  } else if (prompt) {
    LAYUP_CHECK(record.contains("prompt") && record.contains("completion"), where,
                ": the object has \"", record.contains("prompt") ? "prompt" : "completion",
                "\" without \"", record.contains("prompt") ? "completion" : "prompt",
                "\"; a prompt/completion example needs both");
    LAYUP_CHECK(!record["prompt"].is_array() && !record["completion"].is_array(), where,
                ": \"prompt\"/\"completion\" as lists of messages are not supported; write the "
                "conversation as \"messages\"");
    example.kind = InstructionExample::Kind::kPromptCompletion;
    example.prompt = string_field(record, "prompt", where);
    example.completion = string_field(record, "completion", where);
  } else {
    example.kind = InstructionExample::Kind::kChat;
    example.messages = parse_messages(record["messages"], where);
  }
  return example;
}

std::vector<InstructionExample> parse_jsonl_examples(std::string_view text,
                                                     const std::string& path) {
  std::vector<InstructionExample> examples;
  size_t number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    ++number;
    start = end + 1;
    if (is_blank(line)) continue;
    examples.push_back(parse_example_line(line, path + ": line " + std::to_string(number)));
    examples.back().line = number;
  }
  LAYUP_CHECK(!examples.empty(), "cannot tokenize ", path, ": it has no lines with text");
  return examples;
}

std::vector<std::string> instruction_tokenizer_config_files(const std::string& tokenizer_path) {
  const fs::path folder = tokenizer_folder(tokenizer_path);
  std::vector<std::string> files;
  std::error_code ignored;
  for (const char* name : {"tokenizer_config.json", "chat_template.jinja"})
    if (fs::is_regular_file(folder / name, ignored)) files.push_back((folder / name).string());
  return files;
}

InstructionTokenizerConfig read_instruction_tokenizer_config(const std::string& tokenizer_path) {
  const fs::path folder = tokenizer_folder(tokenizer_path);
  InstructionTokenizerConfig config;
  const fs::path config_path = folder / "tokenizer_config.json";
  std::error_code ignored;
  if (fs::is_regular_file(config_path, ignored)) {
    const std::string path = config_path.string();
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(read_whole(config_path));
    } catch (const nlohmann::json::exception& error) {
      fail(path, " is not valid JSON (", error.what(), ")");
    }
    LAYUP_CHECK(json.is_object(), path, " is not a JSON object");
    config.bos_token = special_token_text(json, "bos_token", path);
    config.eos_token = special_token_text(json, "eos_token", path);
    config.chat_template = chat_template_from_config(path);
    config.source = path;
  } else if (is_gpt2_folder(folder)) {
    config.bos_token = config.eos_token = "<|endoftext|>";  // GPT-2's in transformers
    config.source = folder.string() + " (GPT-2's files)";
  } else {
    config.source = config_path.string() + " (missing)";
  }
  // Where both exist, transformers takes the separate file's template.
  if (fs::is_regular_file(folder / "chat_template.jinja", ignored)) {
    config.chat_template = read_whole(folder / "chat_template.jinja");
    config.source += " and chat_template.jinja";
  }
  return config;
}

ExampleEncoder::ExampleEncoder(const Tokenizer& tokenizer, const InstructionTokenizerConfig& config,
                               LearnTokens learn)
    : tokenizer_(tokenizer), config_(config), learn_(learn) {
  if (config_.chat_template) {
    std::shared_ptr<const ChatTemplate> chat;
    try {
      chat = std::make_shared<const ChatTemplate>(*config_.chat_template);
    } catch (const Error& error) {
      // Refused only when a chat line needs it: prompt/completion data does not.
      template_error_ = error.what();
      return;
    }
    const ChatTemplateContext base{config_.bos_token, config_.eos_token, false};
    render_chat_ = [chat, base](std::span<const ChatMessage> messages, bool generation_prompt) {
      ChatTemplateContext context = base;
      context.add_generation_prompt = generation_prompt;
      return chat->render(messages, context);
    };
  }
}

ExampleEncoder::ExampleEncoder(const Tokenizer& tokenizer, const InstructionTokenizerConfig& config,
                               LearnTokens learn, ChatRenderer render_chat)
    : tokenizer_(tokenizer), config_(config), learn_(learn), render_chat_(std::move(render_chat)) {}

std::vector<int32_t> ExampleEncoder::tokenize_special(std::string_view text) const {
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer_))
    return hf->encode(text, {.recognize_special_tokens = true});
  // GPT-2's own files have one special token, the document separator <|endoftext|>.
  const int32_t separator = tokenizer_.document_separator();
  const std::string separator_text = tokenizer_.decode(std::span(&separator, 1));
  std::vector<int32_t> ids;
  for (size_t start = 0;;) {
    const size_t found = text.find(separator_text, start);
    const std::vector<int32_t> piece = tokenizer_.encode(text.substr(start, found - start));
    ids.insert(ids.end(), piece.begin(), piece.end());
    if (found == std::string_view::npos) break;
    ids.push_back(separator);
    start = found + separator_text.size();
  }
  return ids;
}

std::vector<int32_t> ExampleEncoder::tokenize_like_transformers(std::string_view text) const {
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer_))
    return hf->encode(text, {.recognize_special_tokens = true, .add_post_processor_tokens = true});
  return tokenize_special(text);  // GPT-2 adds nothing around the text
}

void ExampleEncoder::encode(const InstructionExample& example, const std::string& where,
                            std::vector<int32_t>& ids, std::vector<uint8_t>& flags) const {
  const size_t first = ids.size();
  switch (example.kind) {
    case InstructionExample::Kind::kText: {
      ids.push_back(tokenizer_.document_separator());
      const std::vector<int32_t> text_ids = tokenizer_.encode(example.text);
      ids.insert(ids.end(), text_ids.begin(), text_ids.end());
      flags.resize(ids.size(), kTokenLearn);
      break;
    }
    case InstructionExample::Kind::kPromptCompletion: {
      LAYUP_CHECK(!config_.eos_token.empty(), where,
                  ": a prompt/completion example ends with the tokenizer's EOS token, and ",
                  config_.source, " names none (\"eos_token\")");
      std::string whole = example.prompt + example.completion;
      if (!example.completion.ends_with(config_.eos_token)) whole += config_.eos_token;
      const std::vector<int32_t> whole_ids = tokenize_like_transformers(whole);
      const size_t prompt_count =
          std::min(tokenize_like_transformers(example.prompt).size(), whole_ids.size());
      ids.insert(ids.end(), whole_ids.begin(), whole_ids.end());
      const uint8_t prompt_flag = learn_ == LearnTokens::kAll ? kTokenLearn : 0;
      flags.resize(first + prompt_count, prompt_flag);
      flags.resize(ids.size(), kTokenLearn);
      break;
    }
    case InstructionExample::Kind::kChat:
      encode_chat(example, where, ids, flags);
      break;
  }
  LAYUP_CHECK(ids.size() > first, where, ": the example has no tokens");
  flags[first] |= kTokenExampleStart;
}

void ExampleEncoder::encode_chat(const InstructionExample& example, const std::string& where,
                                 std::vector<int32_t>& ids, std::vector<uint8_t>& flags) const {
  LAYUP_CHECK(template_error_.empty(), where, ": the chat template of ", config_.source,
              " cannot be used: ", template_error_);
  LAYUP_CHECK(render_chat_ != nullptr, where,
              ": a chat example is rendered with the model's chat template, and ", config_.source,
              " has none (\"chat_template\"); give the tokenizer folder of a chat model "
              "(--tokenizer), or write the examples as prompt/completion");
  const std::span<const ChatMessage> messages = example.messages;
  const auto render = [&](std::span<const ChatMessage> part, bool generation_prompt) {
    try {
      return render_chat_(part, generation_prompt);
    } catch (const Error& error) {
      fail(where, ": the chat template refuses the conversation: ", error.what());
    }
  };
  const std::string whole = render(messages, false);
  const std::vector<int32_t> whole_ids = tokenize_special(whole);
  const size_t first = ids.size();
  ids.insert(ids.end(), whole_ids.begin(), whole_ids.end());
  if (learn_ == LearnTokens::kAll) {
    flags.resize(ids.size(), kTokenLearn);
    return;
  }
  flags.resize(ids.size(), 0);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    // The turn's tokens: what rendering it adds to the conversation before it, less the
    // assistant header that add_generation_prompt already writes there.
    const std::string before = i == 0 ? std::string() : render(messages.first(i), true);
    const std::string through = render(messages.first(i + 1), false);
    LAYUP_CHECK(whole.starts_with(through) && through.starts_with(before), where,
                ": the chat template does not render the conversation up to message ", i + 1,
                " as the beginning of the whole, so its assistant turns cannot be told apart; "
                "learn every token instead (--learn all)");
    const size_t begin = i == 0 ? 0 : tokenize_special(before).size();
    const size_t end = std::min(tokenize_special(through).size(), whole_ids.size());
    for (size_t t = begin; t < end; ++t) flags[first + t] = kTokenLearn;
  }
}

}  // namespace layup
