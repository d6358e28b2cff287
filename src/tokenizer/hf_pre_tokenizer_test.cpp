// Tests of tokenizer.json pre-tokenizers: Metaspace (each prepend_scheme, split on and off),
// Digits (one by one and in runs, any script's digits), their Sequences with Split and ByteLevel,
// and a named layup::Error for what layup does not run.
#include "tokenizer/hf_pre_tokenizer.h"

#include <gtest/gtest.h>

#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using Json = nlohmann::json;
using Pieces = std::vector<std::string>;
using test_files::contains;
using test_files::error_message;

HfPreTokenizer read(const std::string& json) {
  const Json value = Json::parse(json);
  return HfPreTokenizer::read(&value, "tokenizer.json");
}

Pieces pieces(const HfPreTokenizer& pre_tokenizer, std::string_view text,
              bool at_input_start = true) {
  std::deque<std::string> rewritten;
  std::vector<std::string_view> views;
  pre_tokenizer.split(text, at_input_start, rewritten, views);
  return Pieces(views.begin(), views.end());
}

std::string metaspace(const char* scheme, bool split) {
  return std::string(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": ")") +
         scheme + "\", \"split\": " + (split ? "true" : "false") + "}";
}

const std::string kBar = "\u2581";  // ▁

TEST(HfPreTokenizer, MetaspaceReplacesSpacesAndPrepends) {
  // Mistral v0.3's: one piece, "▁" in front of the input's start only.
  const HfPreTokenizer first = read(metaspace("first", false));
  EXPECT_FALSE(first.byte_level());
  EXPECT_EQ(pieces(first, "Hi  there "), (Pieces{kBar + "Hi" + kBar + kBar + "there" + kBar}));
  EXPECT_EQ(pieces(first, "after a special token", false),
            (Pieces{"after" + kBar + "a" + kBar + "special" + kBar + "token"}));
  // Text that starts with a space (or the replacement) gets no second one.
  EXPECT_EQ(pieces(first, " x"), (Pieces{kBar + "x"}));
  EXPECT_EQ(pieces(first, kBar + "x"), (Pieces{kBar + "x"}));

  EXPECT_EQ(pieces(read(metaspace("always", false)), "a b", false),
            (Pieces{kBar + "a" + kBar + "b"}));
  EXPECT_EQ(pieces(read(metaspace("never", false)), "a b"), (Pieces{"a" + kBar + "b"}));
}

TEST(HfPreTokenizer, MetaspaceSplitStartsAPieceAtEachReplacement) {
  const HfPreTokenizer split = read(metaspace("always", true));
  EXPECT_EQ(pieces(split, "Hey  friend! "), (Pieces{kBar + "Hey", kBar, kBar + "friend!", kBar}));
  EXPECT_EQ(pieces(read(metaspace("never", true)), "a b"), (Pieces{"a", kBar + "b"}));
  // The defaults: prepend "always", split on; add_prefix_space is the older spelling.
  EXPECT_EQ(pieces(read(R"({"type": "Metaspace", "replacement": "_", "add_prefix_space": true,
                            "str_rep": "_"})"),
                   "a b", false),
            (Pieces{"_a", "_b"}));
  EXPECT_EQ(pieces(read(R"({"type": "Metaspace", "replacement": "_", "add_prefix_space": false,
                            "prepend_scheme": "never"})"),
                   "a b"),
            (Pieces{"a", "_b"}));
}

TEST(HfPreTokenizer, DigitsAloneOrInRuns) {
  // SmolLM's: each digit alone, then GPT-2's pattern on what is left.
  const HfPreTokenizer smollm = read(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
       "use_regex": true}]})");
  EXPECT_TRUE(smollm.byte_level());
  EXPECT_EQ(
      pieces(smollm, "in 2024, x1 \u0663\u0664\u00B2"),
      (Pieces{"in", " ", "2", "0", "2", "4", ",", " x", "1", " ", "\u0663", "\u0664", "\u00B2"}));
  const HfPreTokenizer runs = read(R"({"type": "Digits", "individual_digits": false})");
  EXPECT_EQ(pieces(runs, "ab12c\u2163\u0663 4"),
            (Pieces{"ab", "12", "c", "\u2163\u0663", " ", "4"}));
  EXPECT_EQ(pieces(runs,
                   "\xFF"
                   "12"),
            (Pieces{"\xFF", "12"}));  // an invalid byte is no digit
}

TEST(HfPreTokenizer, StepsCutEachOthersPieces) {
  // Digits, then Metaspace on each piece: with "always" every piece gets its own "▁".
  const HfPreTokenizer digits_first = read(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": false},
      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
       "split": true}]})");
  EXPECT_EQ(pieces(digits_first, "a 12 b"), (Pieces{kBar + "a", kBar, kBar + "12", kBar + "b"}));
  // With "first", only the first piece of the input.
  const HfPreTokenizer first = read(R"({"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
       "split": false}]})");
  EXPECT_EQ(pieces(first, "12 a"), (Pieces{kBar + "1", "2", kBar + "a"}));
  EXPECT_EQ(pieces(first, "12 a", false), (Pieces{"1", "2", kBar + "a"}));
  // No pre-tokenizer: one piece, as it is.
  EXPECT_EQ(pieces(HfPreTokenizer::read(nullptr, "tokenizer.json"), "a b 1"), (Pieces{"a b 1"}));
}

TEST(HfPreTokenizer, RefusesWhatItDoesNotRun) {
  const auto refused = [](const std::string& json) { return error_message([&] { read(json); }); };
  EXPECT_TRUE(contains(refused(R"({"type": "Metaspace", "replacement": "__"})"),
                       "tokenizer.json: pre_tokenizer.replacement is \"__\"; it must be one "
                       "character"));
  EXPECT_TRUE(
      contains(refused(R"({"type": "Metaspace", "replacement": "_", "prepend_scheme": "x"})"),
               "pre_tokenizer.prepend_scheme is \"x\"; tokenizers knows \"always\", "
               "\"first\" and \"never\""));
  EXPECT_TRUE(contains(refused(R"({"type": "Metaspace", "replacement": "_",
                                   "add_prefix_space": false})"),
                       "pre_tokenizer.add_prefix_space is false but prepend_scheme is not "
                       "\"never\""));
  EXPECT_TRUE(contains(refused(R"({"type": "Digits", "individual_digits": true, "x": 1})"),
                       "pre_tokenizer.x is a field layup does not know"));
  EXPECT_TRUE(contains(refused(R"({"type": "Sequence", "pretokenizers": [
                                   {"type": "ByteLevel"}, {"type": "Digits"}]})"),
                       "pre_tokenizer.pretokenizers[1] (Digits) comes after the ByteLevel step"));
  EXPECT_TRUE(contains(refused(R"({"type": "Punctuation"})"),
                       "pre_tokenizer.type is \"Punctuation\"; layup reads the pre-tokenizers "
                       "Split (behavior Isolated), Digits, Metaspace and ByteLevel"));
}

}  // namespace
}  // namespace layup
