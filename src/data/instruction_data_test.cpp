// Tests of instruction data: every line form and every way a line is refused (naming its line),
// and the flags of each kind of example (the ids against transformers are tests/oracle's).
#include "data/instruction_data.h"

#include <gtest/gtest.h>

#include "data/token_flags.h"
#include "io/test_files.h"
#include "tokenizer/bpe_tokenizer.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using Kind = InstructionExample::Kind;

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tokenizer = BpeTokenizer::load_dir(LAYUP_DATA_DIR "/gpt2-tokenizer");
  return tokenizer;
}

InstructionTokenizerConfig gpt2_config() {
  return read_instruction_tokenizer_config(LAYUP_DATA_DIR "/gpt2-tokenizer");
}

TEST(InstructionExamples, ParsesEveryLineForm) {
  const std::vector<InstructionExample> examples = parse_jsonl_examples(
      "plain words\n"
      "\n"
      "{\"text\": \"a document\", \"id\": 7}\n"
      "{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}\r\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, "
      "{\"role\": \"assistant\", \"content\": \"hello\", \"name\": null}]}",
      "data.jsonl");
  ASSERT_EQ(examples.size(), 4u);
  EXPECT_EQ(examples[0].kind, Kind::kText);
  EXPECT_EQ(examples[0].text, "plain words");
  EXPECT_EQ(examples[1].text, "a document");
  EXPECT_EQ(examples[2].kind, Kind::kPromptCompletion);
  EXPECT_EQ(examples[2].prompt, "Q: 2+2?");
  EXPECT_EQ(examples[2].completion, " 4");
  EXPECT_EQ(examples[3].kind, Kind::kChat);
  ASSERT_EQ(examples[3].messages.size(), 2u);
  EXPECT_EQ(examples[3].messages[1].role, "assistant");
  EXPECT_EQ(examples[3].messages[1].content, "hello");
  EXPECT_FALSE(is_instruction(examples[1]));
  EXPECT_TRUE(is_instruction(examples[2]));
}

TEST(InstructionExamples, BadLinesNameTheirNumberAndTheProblem) {
  const auto error_of = [](const std::string& line) {
    return error_message([&] { parse_jsonl_examples("ok\n\n" + line + "\n", "d.jsonl"); });
  };
  EXPECT_TRUE(contains(error_of("{\"text\": \"x\""),
                       "d.jsonl: line 3: the line starts with '{' "
                       "but is not valid JSON"));
  EXPECT_TRUE(contains(error_of("{\"txt\": \"x\"}"), "line 3: the object has none of"));
  EXPECT_TRUE(contains(error_of("{\"text\": \"x\", \"prompt\": \"y\", \"completion\": \"z\"}"),
                       "more than one of"));
  EXPECT_TRUE(contains(error_of("{\"text\": 5}"), "line 3: \"text\" is number, not a string"));
  EXPECT_TRUE(contains(error_of("{\"prompt\": \"x\"}"), "\"prompt\" without \"completion\""));
  EXPECT_TRUE(contains(error_of("{\"messages\": {}}"), "\"messages\" is object, not a list"));
  EXPECT_TRUE(contains(error_of("{\"messages\": []}"), "empty list"));
  EXPECT_TRUE(contains(error_of("{\"messages\": [{\"role\": \"user\"}]}"),
                       "line 3: message 1 has no \"content\""));
  EXPECT_TRUE(
      contains(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"content\": "
                        "\"b\"}]}"),
               "line 3: message 2 has no \"role\" string"));
  EXPECT_TRUE(contains(error_of("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                                "\"text\"}]}]}"),
                       "not a string (array)"));
  EXPECT_TRUE(contains(error_of("{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", "
                                "\"tool_calls\": []}]}"),
                       "has the field \"tool_calls\""));
  EXPECT_TRUE(contains(error_message([] { parse_jsonl_examples("\n \n", "e.jsonl"); }),
                       "e.jsonl: it has no lines with text"));
  EXPECT_EQ(parse_in(kLearnTokensNames, "all", "--learn"), LearnTokens::kAll);
  EXPECT_EQ(name_of(LearnTokens::kCompletions), "completions");
}

TEST(InstructionExamples, TextIsTodaysDocumentEveryTokenLearned) {
  const ExampleEncoder encoder(gpt2(), gpt2_config(), LearnTokens::kCompletions);
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  encoder.encode(parse_example_line("a <|endoftext|> b", "l1"), "l1", ids, flags);
  std::vector<int32_t> expected = {50256};
  const std::vector<int32_t> text = gpt2().encode("a <|endoftext|> b");  // text stays text
  expected.insert(expected.end(), text.begin(), text.end());
  EXPECT_EQ(ids, expected);
  std::vector<uint8_t> expected_flags(ids.size(), kTokenLearn);
  expected_flags[0] |= kTokenExampleStart;
  EXPECT_EQ(flags, expected_flags);
}

TEST(InstructionExamples, PromptCompletionLearnsTheCompletionAndEndsWithEos) {
  const InstructionExample example = parse_example_line(
      R"({"prompt": "Question: what is 2+2?\nAnswer:", "completion": " 4"})", "l2");
  const size_t prompt_count = gpt2().encode("Question: what is 2+2?\nAnswer:").size();
  for (const LearnTokens learn : {LearnTokens::kCompletions, LearnTokens::kAll}) {
    const ExampleEncoder encoder(gpt2(), gpt2_config(), learn);
    std::vector<int32_t> ids = {1, 2};  // appended after what is there
    std::vector<uint8_t> flags = {kTokenLearn, 0};
    encoder.encode(example, "l2", ids, flags);
    std::vector<int32_t> expected = {1, 2};
    const std::vector<int32_t> whole = gpt2().encode("Question: what is 2+2?\nAnswer: 4");
    expected.insert(expected.end(), whole.begin(), whole.end());
    expected.push_back(50256);
    EXPECT_EQ(ids, expected);
    ASSERT_EQ(flags.size(), ids.size());
    for (size_t t = 2; t < ids.size(); ++t) {
      const bool learned = learn == LearnTokens::kAll || t - 2 >= prompt_count;
      EXPECT_EQ(flags[t] & kTokenLearn, learned ? kTokenLearn : 0) << t;
      EXPECT_EQ(flags[t] & kTokenExampleStart, t == 2 ? kTokenExampleStart : 0) << t;
    }
  }
  // A completion that ends with the EOS text gets no second one.
  const ExampleEncoder encoder(gpt2(), gpt2_config(), LearnTokens::kCompletions);
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  encoder.encode(parse_example_line(R"({"prompt": "a", "completion": " b<|endoftext|>"})", "l"),
                 "l", ids, flags);
  EXPECT_EQ(ids, (std::vector<int32_t>{gpt2().encode("a")[0], gpt2().encode(" b")[0], 50256}));
  EXPECT_EQ(flags, (std::vector<uint8_t>{kTokenExampleStart, kTokenLearn, kTokenLearn}));
}

// A chat "template" of the shape real ones have: a header per turn, an end-of-turn token.
std::string toy_chat(std::span<const ChatMessage> messages, bool generation_prompt) {
  std::string text;
  for (const ChatMessage& message : messages)
    text += message.role + ":" + message.content + "<|endoftext|>";
  if (generation_prompt) text += "assistant:";
  return text;
}

TEST(InstructionExamples, ChatLearnsTheAssistantTurns) {
  const InstructionExample example = parse_example_line(
      R"({"messages": [{"role": "system", "content": " Be brief."},
                       {"role": "user", "content": " Hi"},
                       {"role": "assistant", "content": " Hello there"},
                       {"role": "user", "content": " Bye"},
                       {"role": "assistant", "content": " Bye now"}]})",
      "l");
  const ExampleEncoder encoder(gpt2(), gpt2_config(), LearnTokens::kCompletions, toy_chat);
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  encoder.encode(example, "l", ids, flags);
  EXPECT_EQ(ids, encoder.tokenize_special(toy_chat(example.messages, false)));
  std::string learned;
  for (size_t t = 0; t < ids.size(); ++t)
    if (flags[t] & kTokenLearn) learned += gpt2().decode(std::span(&ids[t], 1));
  EXPECT_EQ(learned, " Hello there<|endoftext|> Bye now<|endoftext|>");
  EXPECT_EQ(flags[0], kTokenExampleStart);

  const ExampleEncoder all(gpt2(), gpt2_config(), LearnTokens::kAll, toy_chat);
  std::vector<int32_t> all_ids;
  std::vector<uint8_t> all_flags;
  all.encode(example, "l", all_ids, all_flags);
  EXPECT_EQ(all_ids, ids);
  EXPECT_TRUE(std::all_of(all_flags.begin(), all_flags.end(),
                          [](uint8_t flag) { return (flag & kTokenLearn) != 0; }));
}

TEST(InstructionExamples, ChatNeedsATemplateThatRendersPrefixes) {
  const InstructionExample example = parse_example_line(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})",
      "d.jsonl: line 4");
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  const ExampleEncoder no_template(gpt2(), gpt2_config(), LearnTokens::kCompletions);
  EXPECT_TRUE(
      contains(error_message([&] { no_template.encode(example, "d.jsonl: line 4", ids, flags); }),
               "d.jsonl: line 4: a chat example is rendered with the model's chat "
               "template"));
  // A template that writes the conversation's length first renders no prefix of the whole.
  const ExampleEncoder counting(gpt2(), gpt2_config(), LearnTokens::kCompletions,
                                [](std::span<const ChatMessage> messages, bool generation_prompt) {
                                  return std::to_string(messages.size()) +
                                         toy_chat(messages, generation_prompt);
                                });
  EXPECT_TRUE(contains(
      error_message([&] { counting.encode(example, "d.jsonl: line 4", ids, flags); }),
      "d.jsonl: line 4: the chat template does not render the conversation up to message 2"));
  const ExampleEncoder refusing(gpt2(), gpt2_config(), LearnTokens::kCompletions,
                                [](std::span<const ChatMessage>, bool) -> std::string {
                                  fail("Conversation roles must alternate user/assistant");
                                });
  EXPECT_TRUE(contains(
      error_message([&] { refusing.encode(example, "d.jsonl: line 4", ids, flags); }),
      "d.jsonl: line 4: the chat template refuses the conversation: Conversation roles must "
      "alternate"));
}

}  // namespace
}  // namespace layup
