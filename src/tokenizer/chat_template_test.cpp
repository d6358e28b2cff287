// ChatTemplate's pieces: jinja2's whitespace rules, the subset refused when parsed (naming the
// construct and its line), runtime errors, and finding the template in a model folder. The
// outputs pinned here are jinja2's, as transformers configures it (tests/oracle/
// test_chat_template.py checks whole templates against transformers itself).
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::TempDir;
using test_files::write_text;

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};

std::string render(const std::string& source, std::vector<ChatMessage> messages = kChat,
                   ChatTemplateContext context = {"<s>", "</s>", false}) {
  return ChatTemplate(source).render(messages, context);
}

TEST(ChatTemplate, RendersChatMlWithTheGenerationPrompt) {
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  const std::vector<ChatMessage> messages = {{"user", "Grüße 👋"}, {"assistant", ""}};
  EXPECT_EQ(render(chatml, messages, {"", "", true}),
            "<|im_start|>user\nGrüße 👋<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render(chatml, messages, {"", "", false}),
            "<|im_start|>user\nGrüße 👋<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
}

TEST(ChatTemplate, MessageTextIsNeverTemplateSyntax) {
  EXPECT_EQ(render("{{ messages[0].content }}", {{"user", "{{ bos_token }} {% if %}"}}),
            "{{ bos_token }} {% if %}");
}

TEST(ChatTemplate, WhitespaceControlAsJinja2WithTrimAndLstripBlocks) {
  // trim_blocks eats the newline after a statement; lstrip_blocks the indent before one.
  EXPECT_EQ(render("a\n  {% if true %}\n  x\n  {% endif %}\n  b\n"), "a\n  x\n  b");
  EXPECT_EQ(render("a {%- if true -%} b {%- endif %} c"), "ab c");
  EXPECT_EQ(render("  {%+ if true %}kept{% endif %}"), "  kept");
  EXPECT_EQ(render("{% if true +%}\nnewline{% endif %}"), "\nnewline");
  // An output tag neither strips its indent nor eats its newline.
  EXPECT_EQ(render("  {{ 'x' }}\n{{ 'y' -}}\n  z"), "  x\nyz");
  EXPECT_EQ(render("{# comment #}\n  {# indented #}\n  x {#- tight -#} y"), "  xy");
  EXPECT_EQ(render("one\r\ntwo\rthree\n"), "one\ntwo\nthree");
}

TEST(ChatTemplate, ExpressionsFollowPython) {
  // ~ binds tighter than +, as in jinja2.
  EXPECT_EQ(render("{{ -7 % 3 }} {{ 7 // -2 }} {{ 1 ~ 2 * 3 }} {{ true == 1 }} {{ none }}"),
            "2 -4 16 True None");
  EXPECT_TRUE(contains(error_message([] { render("{{ 1 + 2 ~ 3 }}"); }), "'int' and 'str'"));
  EXPECT_EQ(render("{{ 'héllo'[1:3] }} {{ 'héllo'[-1] }} {{ 'héllo' | length }}"), "él o 5");
  EXPECT_EQ(render("{{ messages[1:] | length }} {{ messages[-1].content }}"), "3 Bye");
  EXPECT_EQ(render("{{ ' \\u3000 x \\n' | trim }}|{{ 'a,,b'.split(',') | join('/') }}"), "x|a//b");
  EXPECT_EQ(render("{{ {'k': ['é', none, true]} | tojson }}"), "{\"k\": [\"é\", null, true]}");
  EXPECT_EQ(render("{{ 'a\\x41\\u00e9\\d' }}"), "aAé\\d");
}

TEST(ChatTemplate, ALoopScopesItsSetsAndANamespaceCarriesValuesOut) {
  EXPECT_EQ(
      render("{% set x = 1 %}{% for m in messages %}{{ x }}{% set x = 2 %}{% endfor %}{{ x }}"),
      "11111");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for m in messages if m.role == 'user' %}"
                   "{% set ns.n = ns.n + loop.length %}{% endfor %}{{ ns.n }}"),
            "4");
  EXPECT_EQ(render("{% if true %}{% set y = 'if leaks' %}{% endif %}{{ y }}"), "if leaks");
}

TEST(ChatTemplate, UndefinedPrintsEmptyButCannotBeUsed) {
  EXPECT_EQ(render("[{{ nothing }}]{{ nothing is defined }}{{ messages[0].missing is defined }}"),
            "[]FalseFalse");
  EXPECT_TRUE(
      contains(error_message([] { render("{{ nothing.attr }}"); }), "'nothing' is undefined"));
  EXPECT_TRUE(contains(error_message([] { render("\n{{ 'a' + 1 }}"); }), "line 2"));
}

TEST(ChatTemplate, RaiseExceptionThrowsTheTemplatesMessage) {
  const std::string alternating =
      "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
      "{% endfor %}ok";
  EXPECT_EQ(render(alternating, {{"user", "a"}, {"assistant", "b"}}), "ok");
  EXPECT_TRUE(contains(error_message([&] {
                         render(alternating, {{"user", "a"}, {"user", "b"}});
                       }),
                       "Conversation roles must alternate user/assistant"));
}

TEST(ChatTemplate, RefusesWhatIsOutsideTheSubsetWhenParsed) {
  const auto refusal = [](const std::string& source) {
    return error_message([&] { ChatTemplate chat(source); });
  };
  EXPECT_TRUE(contains(refusal("x\n{% macro m() %}{% endmacro %}"), "line 2: the tag {% macro"));
  EXPECT_TRUE(contains(refusal("{{ x | wordcount }}"), "the filter 'wordcount'"));
  EXPECT_TRUE(contains(refusal("{{ x is sameas(1) }}"), "the test 'sameas'"));
  EXPECT_TRUE(contains(refusal("{{ x.format(1) }}"), "the method format()"));
  EXPECT_TRUE(contains(refusal("{{ lipsum() }}"), "the function lipsum()"));
  EXPECT_TRUE(contains(refusal("{{ 1.5 }}"), "float"));
  EXPECT_TRUE(contains(refusal("{{ 3 / 2 }}"), "'/'"));
  EXPECT_TRUE(contains(refusal("{% raw %}x{% endraw %}"), "raw"));
  EXPECT_TRUE(contains(refusal("{% set x %}y{% endset %}"), "block {% set %}"));
  EXPECT_TRUE(contains(refusal("{% break %}"), "break outside a loop"));
  EXPECT_TRUE(contains(refusal("{% if true %}x"), "{% if %} block is never closed"));
  EXPECT_TRUE(contains(refusal("{% endfor %}"), "unexpected {% endfor %}"));
  EXPECT_TRUE(contains(refusal("{{ x"), "never closed"));
  EXPECT_TRUE(contains(refusal("{# x"), "never closed"));
  EXPECT_TRUE(contains(refusal("{{ 'a' is eq 'a' }}"), "without parentheses"));
  // jinja2 knows no "+}}": the "+" is an operator missing its right side.
  EXPECT_TRUE(contains(refusal("{{ 'x' +}}"), "line 1"));
}

TEST(ChatTemplate, PrintingAListIsRefusedRatherThanGuessed) {
  EXPECT_TRUE(contains(error_message([] { render("{{ [1, 2] }}"); }), "printing a list"));
  EXPECT_TRUE(contains(error_message([] { render("{{ 'É' | lower }}"); }), "non-ASCII"));
}

TEST(ChatTemplate, FindsTheTemplateOfAModelFolder) {
  TempDir dir;
  const std::string config = dir.file("tokenizer_config.json");
  write_text(config, R"({"bos_token": "<s>"})");
  EXPECT_EQ(chat_template_from_config(config), std::nullopt);
  write_text(config, R"({"chat_template": "{{ bos_token }}"})");
  EXPECT_EQ(chat_template_from_config(config), "{{ bos_token }}");
  write_text(config, R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                           {"name": "default", "template": "D"}]})");
  EXPECT_EQ(chat_template_from_config(config), "D");
  write_text(config, R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_TRUE(contains(error_message([&] { chat_template_from_config(config); }),
                       "(tool_use) and none \"default\""));
  write_text(dir.file("chat_template.jinja"), "from the file");
  EXPECT_EQ(chat_template_from_config(config), "from the file");
  std::filesystem::remove(dir.file("chat_template.jinja"));
  write_text(config, "{not json");
  EXPECT_TRUE(
      contains(error_message([&] { chat_template_from_config(config); }), "not valid JSON"));
}

}  // namespace
}  // namespace layup
