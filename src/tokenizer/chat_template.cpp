// ChatTemplate: parses a chat template once, renders it per conversation (chat_template.h).
#include "tokenizer/chat_template.h"

#include "core/error.h"

namespace layup {

namespace jinja {
struct Template {};
}  // namespace jinja

ChatTemplate::ChatTemplate(std::string source) {
  (void)source;
  fail("chat templates are not supported yet");
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(std::span<const ChatMessage>, const ChatTemplateContext&) const {
  fail("chat templates are not supported yet");
}

std::optional<std::string> chat_template_from_config(const std::string& tokenizer_config_path) {
  (void)tokenizer_config_path;
  fail("chat templates are not supported yet");
}

}  // namespace layup
