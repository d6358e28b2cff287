// Tests of tokenizer.json normalizers: Llama 2's Prepend + Replace, Unicode forms inside a
// Sequence, and a named layup::Error for what layup does not run.
#include "tokenizer/hf_normalizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "io/test_files.h"

namespace layup {
namespace {

using Json = nlohmann::json;
using test_files::contains;
using test_files::error_message;

std::string normalized(const char* normalizer_json, std::string_view text) {
  return HfNormalizer::read(Json::parse(normalizer_json), "tokenizer.json").normalize(text);
}

// Llama 2's and Mistral v0.1's, as transformers' LlamaConverter writes it (legacy).
constexpr const char* kLlama2 = R"({"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})";

TEST(HfNormalizer, Llama2PrependsAndReplacesSpaces) {
  EXPECT_EQ(normalized(kLlama2, "Hi there"), "\u2581Hi\u2581there");
  EXPECT_EQ(normalized(kLlama2, "  two\n spaces "), "\u2581\u2581\u2581two\n\u2581spaces\u2581");
  EXPECT_EQ(normalized(kLlama2, "\u2581already"), "\u2581\u2581already");
  EXPECT_EQ(normalized(kLlama2, ""), "");  // Prepend leaves empty text empty
  // Invalid UTF-8 passes through.
  EXPECT_EQ(normalized(kLlama2, "a\xFF b"), "\u2581a\xFF\u2581b");
}

TEST(HfNormalizer, StepsRunInOrderAndNest) {
  // Replace before Prepend: the prepended text is not replaced.
  EXPECT_EQ(normalized(R"({"type": "Sequence", "normalizers": [
                {"type": "Replace", "pattern": {"String": "ab"}, "content": "b"},
                {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "ab"}]}]})",
                       "aab abab"),
            "abab bb");
  // The replaced text is not searched again.
  EXPECT_EQ(
      normalized(R"({"type": "Replace", "pattern": {"String": "aa"}, "content": "a"})", "aaaaa"),
      "aaa");
  EXPECT_EQ(normalized(R"({"type": "Sequence", "normalizers": [{"type": "NFKC"},
                {"type": "Replace", "pattern": {"String": "fi"}, "content": "F"}]})",
                       "\uFB01 fi"),
            "F F");
}

TEST(HfNormalizer, RefusesWhatItDoesNotRun) {
  const auto refused = [](const char* json) {
    return error_message([&] { normalized(json, ""); });
  };
  EXPECT_TRUE(contains(refused(R"({"type": "Sequence", "normalizers": [{"type": "Lowercase"}]})"),
                       "tokenizer.json: normalizer.normalizers[0].type is \"Lowercase\"; layup "
                       "implements the normalizers NFC, NFD, NFKC, NFKD, Prepend and Replace"));
  EXPECT_TRUE(contains(
      refused(R"({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "})"),
      "tokenizer.json: normalizer.pattern is a Regex; layup's Replace normalizer takes a String"));
  EXPECT_TRUE(contains(refused(R"({"type": "Replace", "pattern": {"String": ""}, "content": "x"})"),
                       "normalizer.pattern.String is empty"));
  EXPECT_TRUE(contains(refused(R"({"type": "Prepend", "prepend": "x", "when": 1})"),
                       "normalizer.when is a field layup does not know"));
  EXPECT_TRUE(contains(refused(R"({"type": "NFC", "x": 1})"),
                       "normalizer.x is a field layup does not know"));
}

}  // namespace
}  // namespace layup
