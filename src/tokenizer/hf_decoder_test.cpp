// Tests of tokenizer.json decoders: Llama 2's Replace, ByteFallback, Fuse and Strip, the Metaspace
// decoder, no decoder, and a named layup::Error for what layup does not run.
#include "tokenizer/hf_decoder.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using Json = nlohmann::json;
using Tokens = std::vector<std::string>;
using test_files::contains;
using test_files::error_message;

std::string decoded(const char* decoder_json, Tokens tokens, bool byte_level = false) {
  const Json value = Json::parse(decoder_json);
  return HfDecoder::read(&value, byte_level, "tokenizer.json").decode(std::move(tokens));
}

// Llama 2's and Mistral's, as transformers' LlamaConverter writes it.
constexpr const char* kLlama2 = R"({"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";

TEST(HfDecoder, Llama2JoinsBytesAndStripsOneLeadingSpace) {
  EXPECT_EQ(decoded(kLlama2, {"\u2581Hi", "\u2581the", "re"}), "Hi there");
  EXPECT_EQ(decoded(kLlama2, {"\u2581\u2581x"}), " x");  // only one space goes
  EXPECT_EQ(decoded(kLlama2, {"<s>", "\u2581Hi"}), "<s> Hi");
  // Byte tokens in a row are one piece of UTF-8: "▁é😀".
  EXPECT_EQ(
      decoded(kLlama2, {"\u2581", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"}),
      "\u00E9\U0001F600");
  // Bytes that are not UTF-8 become one U+FFFD each; a run ends at any other token.
  EXPECT_EQ(decoded(kLlama2, {"a", "<0xC3>", "<0x41>", "b", "<0xA9>"}), "a\uFFFD\uFFFDb\uFFFD");
  // What is no byte token stays: lower-case hex is read, as Rust's from_str_radix reads it.
  EXPECT_EQ(decoded(kLlama2, {"<0x6a>", "<0xZZ>", "<0x4A"}), "j<0xZZ><0x4A");
}

TEST(HfDecoder, StripCountsCharactersAtBothEnds) {
  EXPECT_EQ(decoded(R"({"type": "Strip", "content": "\u2581", "start": 2, "stop": 1})",
                    {"\u2581\u2581\u2581a\u2581\u2581", "\u2581b\u2581"}),
            "\u2581a\u2581b");
}

TEST(HfDecoder, MetaspaceDropsEveryReplacementOfTheFirstToken) {
  // tokenizers drops them all in the first token, not just the leading one.
  EXPECT_EQ(decoded(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                        "split": false})",
                    {"\u2581a\u2581b", "\u2581c"}),
            "ab c");
  EXPECT_EQ(decoded(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never"})",
                    {"\u2581a\u2581b", "\u2581c"}),
            " a b c");
}

TEST(HfDecoder, NoDecoderJoinsWithSpacesUnlessByteLevel) {
  EXPECT_EQ(HfDecoder::read(nullptr, false, "t.json").decode({"a", "b"}), "a b");
  EXPECT_EQ(HfDecoder::read(nullptr, true, "t.json").decode({"a", "b"}), "ab");
  EXPECT_EQ(decoded(R"({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                        "use_regex": true})",
                    {"a", " \xFF"}, true),
            "a \xFF");
}

TEST(HfDecoder, RefusesWhatItDoesNotRun) {
  const auto refused = [](const char* json, bool byte_level = false) {
    return error_message([&] { decoded(json, {}, byte_level); });
  };
  EXPECT_TRUE(contains(refused(R"({"type": "Sequence", "decoders": [{"type": "WordPiece"}]})"),
                       "tokenizer.json: decoder.decoders[0].type is \"WordPiece\"; layup reads the "
                       "decoders Replace, ByteFallback, Fuse, Strip and Metaspace"));
  EXPECT_TRUE(contains(refused(R"({"type": "ByteLevel"})"),
                       "decoder.type is \"ByteLevel\"; ByteLevel decodes a byte-level BPE"));
  EXPECT_TRUE(contains(refused(kLlama2, true),
                       "decoder.type is \"Sequence\"; a byte-level BPE (pre-tokenizer ByteLevel) "
                       "is decoded by ByteLevel"));
  EXPECT_TRUE(contains(refused(R"({"type": "Replace", "pattern": {"Regex": "x"}, "content": ""})"),
                       "decoder.pattern is a Regex; layup's Replace decoder takes a String"));
  EXPECT_TRUE(contains(refused(R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})"),
                       "decoder.start and .stop count characters"));
  EXPECT_TRUE(
      contains(refused(R"({"type": "Fuse", "x": 1})"), "decoder.x is a field layup does not know"));
}

}  // namespace
}  // namespace layup
