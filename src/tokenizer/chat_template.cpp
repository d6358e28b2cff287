// ChatTemplate: parses a chat template once, renders it per conversation (chat_template.h), with
// the variables transformers' apply_chat_template passes: messages, the special tokens, and
// tools and documents as None.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_render.h"
#include "tokenizer/tokenizer_files.h"

namespace layup {

ChatTemplate::ChatTemplate(std::string source)
    : template_(std::make_unique<const jinja::Template>(jinja::parse_template(source))) {}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(std::span<const ChatMessage> messages,
                                 const ChatTemplateContext& context) const {
  using jinja::Value;
  jinja::List message_values;
  for (const ChatMessage& message : messages)
    message_values.push_back(Value::of(
        jinja::Dict{{"role", Value::of(message.role)}, {"content", Value::of(message.content)}}));
  std::vector<std::pair<std::string, Value>> globals = jinja::builtin_globals();
  globals.emplace_back("messages", Value::of(std::move(message_values)));
  globals.emplace_back("bos_token", Value::of(context.bos_token));
  globals.emplace_back("eos_token", Value::of(context.eos_token));
  globals.emplace_back("add_generation_prompt", Value::of(context.add_generation_prompt));
  globals.emplace_back("tools", Value::none());
  globals.emplace_back("documents", Value::none());
  return jinja::render(*template_, globals);
}

std::optional<std::string> chat_template_from_config(const std::string& tokenizer_config_path) {
  // Recent transformers save the template as chat_template.jinja beside the config, and read that
  // file first.
  const std::filesystem::path jinja_file =
      std::filesystem::path(tokenizer_config_path).parent_path() / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja_file)) return read_tokenizer_file(jinja_file.string());
  const std::string text = read_tokenizer_file(tokenizer_config_path);
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(tokenizer_config_path, " is not valid JSON: ", e.what());
  }
  LAYUP_CHECK(config.is_object(), tokenizer_config_path, " does not hold a JSON object");
  const auto found = config.find("chat_template");
  if (found == config.end() || found->is_null()) return std::nullopt;
  if (found->is_string()) return found->get<std::string>();
  // The list form: [{"name": "default", "template": "..."}, {"name": "tool_use", ...}].
  LAYUP_CHECK(found->is_array(), tokenizer_config_path,
              ": chat_template is neither a string nor a list of named templates");
  std::string names;
  for (const nlohmann::json& entry : *found) {
    LAYUP_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                    entry.contains("template") && entry["template"].is_string(),
                tokenizer_config_path,
                ": each chat_template entry needs a \"name\" and a \"template\" string");
    if (entry["name"] == "default") return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  // transformers, too, refuses to guess which of several named templates is meant.
  fail(tokenizer_config_path, ": chat_template names several templates (", names,
       ") and none \"default\"; layup renders only the default one");
}

}  // namespace layup
