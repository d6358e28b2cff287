// Renders conversations with layup's ChatTemplate, for tests/oracle/test_chat_template.py.
//
//   layup_chat_template_tool TEMPLATE CASES_JSON OUTPUT_JSON
//
// CASES_JSON is a list of {"messages": [{"role", "content"}...], "bos_token", "eos_token",
// "add_generation_prompt"}, each rendered with TEMPLATE (a file, parsed once) or with the case's
// own "template" text where it has one. OUTPUT_JSON gets one {"text": ...} or {"error": ...} (the
// template refused when parsed or when rendered) per case.
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat_template.h"

namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  LAYUP_CHECK(file, "cannot open ", path);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

nlohmann::json render_case(const layup::ChatTemplate& chat, const nlohmann::json& c) {
  std::vector<layup::ChatMessage> messages;
  for (const nlohmann::json& m : c.at("messages"))
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  const layup::ChatTemplateContext context{c.value("bos_token", ""), c.value("eos_token", ""),
                                           c.value("add_generation_prompt", false)};
  return {{"text", chat.render(messages, context)}};
}

nlohmann::json render_cases(const std::string& source, const nlohmann::json& cases) {
  std::optional<layup::ChatTemplate> shared;
  nlohmann::json results = nlohmann::json::array();
  for (const nlohmann::json& c : cases) {
    try {
      if (c.contains("template")) {
        results.push_back(render_case(layup::ChatTemplate(c["template"].get<std::string>()), c));
      } else {
        if (!shared) shared.emplace(source);
        results.push_back(render_case(*shared, c));
      }
    } catch (const layup::Error& e) {
      results.push_back({{"error", e.what()}});
    }
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    LAYUP_CHECK(argc == 4, "usage: layup_chat_template_tool TEMPLATE CASES_JSON OUTPUT_JSON");
    const nlohmann::json results =
        render_cases(read_text(argv[1]), nlohmann::json::parse(read_text(argv[2])));
    std::ofstream(argv[3], std::ios::binary) << results.dump();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layup_chat_template_tool: %s\n", e.what());
    return 1;
  }
}
