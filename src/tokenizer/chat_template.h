// A model's chat template (tokenizer_config.json "chat_template", a Jinja template) rendered as
// transformers' apply_chat_template renders it: jinja2 with trim_blocks and lstrip_blocks, the
// variables `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, and
// `raise_exception(message)`.
//
//   ChatTemplate chat(*chat_template_from_config("Qwen2.5-0.5B-Instruct/tokenizer_config.json"));
//   std::vector<ChatMessage> messages = {{"user", "Hi"}, {"assistant", "Hello!"}};
//   chat.render(messages, {.eos_token = "<|im_end|>"});  // "<|im_start|>system\n..."
//
// Only the Jinja subset that the templates of Llama 2, Llama 3, Qwen2, Mistral and SmolLM use is
// implemented (docs/models.md lists it); a template that uses anything else is refused when it is
// parsed, with a layup::Error naming the construct and its line. A template that calls
// raise_exception (Mistral's, on roles that do not alternate) throws a layup::Error with its
// message when rendered.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

namespace layup {

struct ChatMessage {
  std::string role, content;
};

struct ChatTemplateContext {
  std::string bos_token, eos_token;
  bool add_generation_prompt = false;
};

namespace jinja {
struct Template;
}

class ChatTemplate {
 public:
  // Parses the template; throws layup::Error for a syntax error or a construct outside the
  // subset.
  explicit ChatTemplate(std::string source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  std::string render(std::span<const ChatMessage> messages,
                     const ChatTemplateContext& context) const;

 private:
  std::unique_ptr<const jinja::Template> template_;
};

// The template text from a model folder's tokenizer_config.json ("chat_template", a string or
// the list form's "default", a layup::Error where the list has none); nullopt where it has none. A
// chat_template.jinja file beside it (how transformers saves templates now) comes first, as
// transformers reads it.
std::optional<std::string> chat_template_from_config(const std::string& tokenizer_config_path);

}  // namespace layup
