// Tests of tokenizer.json loading on small files built here: merge ranks from the list's order
// (not the ids), merges of pairs (not of any two parts that make a token), ignore_merges, added
// and special tokens, the post-processor's template, the pre-tokenizer's steps, Llama 2's and
// Mistral v0.3's SentencePiece-style files end to end, and a named layup::Error for every file
// layup cannot encode faithfully.
#include "tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using namespace std::string_literals;
using Json = nlohmann::json;
using Ids = std::vector<int32_t>;
using test_files::contains;
using test_files::error_message;
using test_files::TempDir;
using test_files::write_text;

// How GPT-2's byte alphabet spells `bytes` (the inverse of bytes_of_spelling).
std::string spelled(std::string_view bytes) {
  std::string text;
  for (char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    unsigned code_point = byte;
    if (!((byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE)) {
      code_point = 256;
      for (unsigned lower = 0; lower < byte; ++lower) {
        code_point +=
            !((lower >= '!' && lower <= '~') || (lower >= 0xA1 && lower <= 0xAC) || lower >= 0xAE);
      }
    }
    if (code_point < 0x80) {
      text += static_cast<char>(code_point);
    } else {
      text += static_cast<char>(0xC0 | (code_point >> 6));
      text += static_cast<char>(0x80 | (code_point & 0x3F));
    }
  }
  return text;
}

// The id of the single byte b: the bytes in reverse order, so no id equals its byte.
int32_t byte_id(char b) {
  return 255 - static_cast<unsigned char>(b);
}

// A tokenizer.json: the 256 bytes, then `merged` tokens (ids from 256 in order), the merges as
// "a b" strings, and a plain ByteLevel pre-tokenizer.
Json tokenizer_json(const std::vector<std::string>& merged = {},
                    const std::vector<std::string>& merges = {}) {
  Json vocab = Json::object();
  for (int byte = 0; byte < 256; ++byte)
    vocab[spelled(std::string(1, static_cast<char>(byte)))] = byte_id(static_cast<char>(byte));
  for (size_t i = 0; i < merged.size(); ++i) vocab[spelled(merged[i])] = 256 + i;
  Json merge_list = Json::array();
  for (const std::string& merge : merges) {
    const size_t space = merge.find(' ');
    merge_list.push_back(spelled(merge.substr(0, space)) + " " + spelled(merge.substr(space + 1)));
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", Json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", false},
            {"use_regex", true}}},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merge_list}}}};
}

HfTokenizer load(const Json& json) {
  return HfTokenizer::from_json(json.dump(), "tokenizer.json");
}

std::string load_error(const Json& json) {
  return error_message([&] { load(json); });
}

Json added_token(int id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

TEST(HfTokenizer, BytesAloneAreTheirTokens) {
  const HfTokenizer tokenizer = load(tokenizer_json());
  EXPECT_EQ(tokenizer.vocab_size(), 256);
  EXPECT_EQ(tokenizer.encode("a b"), (Ids{byte_id('a'), byte_id(' '), byte_id('b')}));
  const std::string bytes = "\xFF\x00 \xC3(\r\n\xF0\x9F\x98\x80"s;
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(bytes)), bytes);
}

TEST(HfTokenizer, MergeRankIsTheMergeListsOrderNotTheId) {
  // "ab" has the lower id, but "b c" comes first in the list, so it merges first.
  const HfTokenizer tokenizer = load(tokenizer_json({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(tokenizer.encode("abc"), (Ids{byte_id('a'), 257}));
  EXPECT_EQ(tokenizer.encode("abd"), (Ids{256, byte_id('d')}));
  const HfTokenizer reversed = load(tokenizer_json({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_EQ(reversed.encode("abc"), (Ids{256, byte_id('c')}));
}

TEST(HfTokenizer, OnlyListedPairsMerge) {
  // "abc" is a token, but only "a" + "bc" makes it; "ab" + "c" does not, although the bytes
  // would be the same (tiktoken's rule would merge them).
  const Json json = tokenizer_json({"ab", "bc", "abc"}, {"a b", "b c", "a bc"});
  EXPECT_EQ(load(json).encode("abc"), (Ids{256, byte_id('c')}));
  EXPECT_EQ(load(json).encode("xbc"), (Ids{byte_id('x'), 257}));
  // With ignore_merges, a piece that is a token is that token.
  Json ignoring = json;
  ignoring["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(ignoring).encode("abc"), (Ids{258}));
  EXPECT_EQ(load(ignoring).encode("abc abc"), (Ids{258, byte_id(' '), 256, byte_id('c')}));
}

TEST(HfTokenizer, LeftmostOfEqualRanksMergesFirst) {
  const HfTokenizer tokenizer = load(tokenizer_json({"aa", "aaaa"}, {"a a", "aa aa"}));
  EXPECT_EQ(tokenizer.encode("aaa"), (Ids{256, byte_id('a')}));
  EXPECT_EQ(tokenizer.encode("aaaaa"), (Ids{257, byte_id('a')}));
}

TEST(HfTokenizer, BothMergeSerialisationsLoadTheSame) {
  Json pairs = tokenizer_json({"ab", "bc"}, {"b c", "a b"});
  pairs["model"]["merges"] = Json::array({Json::array({"b", "c"}), Json::array({"a", "b"})});
  EXPECT_EQ(load(pairs).encode("abcab"), (Ids{byte_id('a'), 257, 256}));
}

TEST(HfTokenizer, AddedAndSpecialTokens) {
  Json json = tokenizer_json();
  json["added_tokens"] =
      Json::array({added_token(256, "<|im_start|>", true), added_token(257, "<tool>", false),
                   added_token(258, "<tool>x", false)});
  const HfTokenizer tokenizer = load(json);
  EXPECT_EQ(tokenizer.vocab_size(), 259);
  EXPECT_EQ(tokenizer.added_token_id("<|im_start|>"), 256);
  EXPECT_EQ(tokenizer.added_token_id("<|im_end|>"), std::nullopt);

  const std::string text = "a<|im_start|>b<tool>x<tool>";
  // By default special tokens are text; added tokens that are not special are always found, the
  // longest at the leftmost place.
  Ids expected = {byte_id('a')};
  for (char c : std::string("<|im_start|>")) expected.push_back(byte_id(c));
  expected.insert(expected.end(), {byte_id('b'), 258, 257});
  EXPECT_EQ(tokenizer.encode(text), expected);
  EXPECT_EQ(tokenizer.encode(text, {.recognize_special_tokens = true}),
            (Ids{byte_id('a'), 256, byte_id('b'), 258, 257}));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(text, {.recognize_special_tokens = true})), text);
  EXPECT_EQ(tokenizer.decode(Ids{256, 257}), "<|im_start|><tool>");
  EXPECT_TRUE(contains(error_message([&] { tokenizer.decode(Ids{259}); }),
                       "cannot decode token id 259: the vocabulary of tokenizer.json has ids "
                       "0..258"));
}

TEST(HfTokenizer, PostProcessorTemplateAndDocumentSeparator) {
  Json json = tokenizer_json();
  json["added_tokens"] = Json::array(
      {added_token(256, "<|begin_of_text|>", true), added_token(257, "<|end_of_text|>", true)});
  // Llama 3's: ByteLevel, then a template with the BOS token in front.
  json["post_processor"] = Json::parse(R"({
    "type": "Sequence",
    "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [256],
                                                "tokens": ["<|begin_of_text|>"]}}}]})");
  const HfTokenizer tokenizer = load(json);
  EXPECT_EQ(tokenizer.encode("hi"), (Ids{byte_id('h'), byte_id('i')}));
  EXPECT_EQ(tokenizer.encode("hi", {.add_post_processor_tokens = true}),
            (Ids{256, byte_id('h'), byte_id('i')}));
  EXPECT_EQ(tokenizer.document_separator(), 256);

  // Without a template, <|endoftext|> or <|end_of_text|> separates documents.
  json["post_processor"] = nullptr;
  EXPECT_EQ(load(json).document_separator(), 257);
  json["added_tokens"] = Json::array();
  EXPECT_TRUE(contains(error_message([&] { load(json).document_separator(); }),
                       "no token to put between documents"));
}

TEST(HfTokenizer, SplitStepsRunBeforeByteLevel) {
  // "5 " (a five and a space) is a token, which GPT-2's pattern never lets form.
  const std::vector<std::string> merges = {"5 5", "5  "};
  Json json = tokenizer_json({"55", "5 "}, merges);
  EXPECT_EQ(load(json).encode("5555"), (Ids{256, 256}));  // GPT-2's pattern: digits stay whole
  EXPECT_EQ(load(json).encode("5 5"), (Ids{byte_id('5'), byte_id(' '), byte_id('5')}));
  // Llama 3's style cuts digits into threes.
  json["pre_tokenizer"] = Json::parse(R"({
    "type": "Sequence",
    "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|\\p{N}{1,3}|\\p{L}+|\\s+"},
       "behavior": "Isolated", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})");
  EXPECT_EQ(load(json).encode("5555"), (Ids{256, byte_id('5'), byte_id('5')}));
  // A Split that keeps "5 5" whole lets "5 " form; ByteLevel with use_regex on then cuts again.
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "[^x]+"}};
  EXPECT_EQ(load(json).encode("5 5"), (Ids{257, byte_id('5')}));
  json["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
  EXPECT_EQ(load(json).encode("5 5"), (Ids{byte_id('5'), byte_id(' '), byte_id('5')}));
  // A String pattern matches literally.
  json["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", "5 "}};
  json["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = false;
  EXPECT_EQ(load(json).encode("55 5"), (Ids{byte_id('5'), 257, byte_id('5')}));
}

TEST(HfTokenizer, NormalizerRunsBetweenTheAddedTokensOfTheRawText) {
  Json json = tokenizer_json({"\u00E9"}, {"\xC3 \xA9"});  // é
  json["normalizer"] = {{"type", "NFC"}};
  // One added token is matched in the raw text, the other in the normalized text.
  json["added_tokens"] =
      Json::array({added_token(257, "e\u0301!", true), added_token(258, "\u00E9?", false)});
  const HfTokenizer tokenizer = load(json);
  EXPECT_EQ(tokenizer.encode("e\u0301"), (Ids{256}));
  EXPECT_EQ(tokenizer.decode(tokenizer.encode("e\u0301")), "\u00E9");
  EXPECT_EQ(tokenizer.encode("e\u0301!", {.recognize_special_tokens = true}), (Ids{257}));
  EXPECT_EQ(tokenizer.encode("e\u0301!"), (Ids{256, byte_id('!')}));
  EXPECT_EQ(tokenizer.encode("e\u0301?"), (Ids{258}));
  // Invalid bytes stay, and stop composition across them.
  EXPECT_EQ(tokenizer.encode("e\xFF\u0301"),
            (Ids{byte_id('e'), byte_id('\xFF'), byte_id('\xCC'), byte_id('\x81')}));
  json["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(load(json).decode(load(json).encode("\uFB01 \u2460")), "fi 1");
}

// A SentencePiece-style file as transformers' LlamaConverter writes Llama 2's (legacy: Prepend
// and Replace normalize, no pre-tokenizer) or, with `metaspace_first`, Mistral v0.3's (no
// normalizer; Metaspace with prepend_scheme "first"). Tokens: <unk> <s> </s>, the 256 byte tokens
// (3..258), "▁" 259, "h" 260, "i" 261, "hi" 262, "▁hi" 263.
Json sentencepiece_json(bool metaspace_first) {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    vocab[name] = 3 + byte;
  }
  vocab["\u2581"] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["hi"] = 262;
  vocab["\u2581hi"] = 263;
  Json json = Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
      "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
      "byte_fallback": true, "ignore_merges": false,
      "merges": [["h", "i"], ["\u2581", "hi"]]}})");
  json["model"]["vocab"] = vocab;
  if (metaspace_first) {
    json["normalizer"] = nullptr;
    json["pre_tokenizer"] = {{"type", "Metaspace"},
                             {"replacement", "\u2581"},
                             {"prepend_scheme", "first"},
                             {"split", false}};
  }
  return json;
}

TEST(HfTokenizer, SentencePieceStyleFiles) {
  const HfTokenizer llama2 = load(sentencepiece_json(false));
  EXPECT_EQ(llama2.vocab_size(), 264);
  EXPECT_EQ(llama2.encode("hi hi"), (Ids{263, 263}));
  EXPECT_EQ(llama2.encode("hi", {.add_post_processor_tokens = true}), (Ids{1, 263}));
  EXPECT_EQ(llama2.document_separator(), 1);
  // Each stretch between special tokens gets its own "▁"; bytes stand in for "é".
  EXPECT_EQ(llama2.encode("hi</s>\u00E9", {.recognize_special_tokens = true}),
            (Ids{263, 2, 259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(llama2.decode(Ids{263, 2, 259, 3 + 0xC3, 3 + 0xA9}), "hi</s> \u00E9");
  EXPECT_EQ(llama2.decode(llama2.encode(" hi  ih")), " hi  ih");
  // An added token matched in normalized text is looked for as normalized: "▁<t>".
  Json with_added = sentencepiece_json(false);
  with_added["added_tokens"].push_back(added_token(264, "<t>", false));
  const HfTokenizer added = load(with_added);
  EXPECT_EQ(added.encode("hi <t>"), (Ids{263, 264}));
  EXPECT_EQ(added.encode("<t>"), (Ids{264}));
  EXPECT_EQ(added.encode("hi<t>"), (Ids{263, 3 + '<', 3 + 't', 3 + '>'}));
  EXPECT_EQ(added.decode(Ids{263, 264}), "hi <t>");

  // Mistral v0.3's: "▁" only at the start of the input, not after a special token.
  const HfTokenizer mistral = load(sentencepiece_json(true));
  EXPECT_EQ(mistral.encode("hi hi"), (Ids{263, 263}));
  EXPECT_EQ(mistral.encode("hi</s>hi", {.recognize_special_tokens = true}), (Ids{263, 2, 262}));
  EXPECT_EQ(mistral.encode("</s>hi", {.recognize_special_tokens = true}), (Ids{2, 262}));
  EXPECT_EQ(mistral.decode(mistral.encode(" hi")), "hi");  // as tokenizers decodes it
}

TEST(HfTokenizer, LoadsFromAFile) {
  TempDir dir;
  write_text(dir.file("tokenizer.json"), tokenizer_json({"ab"}, {"a b"}).dump(2));
  EXPECT_EQ(HfTokenizer::from_file(dir.file("tokenizer.json")).encode("ab"), (Ids{256}));
  EXPECT_TRUE(contains(error_message([&] { HfTokenizer::from_file(dir.file("missing.json")); }),
                       "cannot open tokenizer file " + dir.file("missing.json")));
}

TEST(HfTokenizer, LoadTokenizerPicksTheClassFromTheFiles) {
  TempDir dir;
  write_text(dir.file("tokenizer.json"), tokenizer_json({"ab"}, {"a b"}).dump());
  EXPECT_EQ(load_tokenizer(dir.path())->vocab_size(), 257);
  EXPECT_EQ(load_tokenizer(dir.file("tokenizer.json"))->encode("ab"), (Ids{256}));
  EXPECT_EQ(load_tokenizer(LAYUP_DATA_DIR "/gpt2-tokenizer")->vocab_size(), 50257);
  // GPT-2's own files win over a tokenizer.json beside them, as before tokenizer.json was read.
  std::filesystem::copy_file(LAYUP_DATA_DIR "/gpt2-tokenizer/gpt2.tiktoken",
                             dir.file("gpt2.tiktoken"));
  EXPECT_EQ(load_tokenizer(dir.path())->document_separator(), 50256);

  TempDir empty;
  const std::string message = error_message([&] { load_tokenizer(empty.path()); });
  EXPECT_TRUE(contains(message, "no tokenizer in " + empty.path() + ": expected " +
                                    empty.file("tokenizer.json") + " (Hugging Face)"));
  EXPECT_TRUE(contains(error_message([&] { load_tokenizer(empty.file("nothing")); }),
                       "it is neither a tokenizer.json file nor a folder"));
}

// Every file layup cannot encode faithfully is refused, the message naming the field.
TEST(HfTokenizer, RefusesWhatItDoesNotImplement) {
  const auto refused = [](const std::function<void(Json&)>& change) {
    Json json = tokenizer_json({"ab"}, {"a b"});
    change(json);
    return load_error(json);
  };
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["type"] = "WordPiece"; }),
                       "tokenizer.json: model.type is \"WordPiece\"; layup reads BPE models only"));
  EXPECT_TRUE(
      contains(refused([](Json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout is 0.1"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
                       "model.continuing_subword_prefix is \"##\""));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["new_option"] = 1; }),
                       "model.new_option is a field layup does not know"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["extra"] = 1; }),
                       "tokenizer.json: extra is a field layup does not know"));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["normalizer"] = {{"type", "Lowercase"}};
                       }),
                       "normalizer.type is \"Lowercase\"; layup implements the normalizers NFC, "
                       "NFD, NFKC, NFKD, Prepend and Replace"));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["truncation"] = {{"max_length", 8}};
                       }),
                       "truncation is {\"max_length\":8}"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }),
                       "pre_tokenizer.add_prefix_space is true; layup supports only false"));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["pre_tokenizer"] = {{"type", "Whitespace"}};
                       }),
                       "pre_tokenizer.type is \"Whitespace\"; layup reads the pre-tokenizers Split "
                       "(behavior Isolated), Digits, Metaspace and ByteLevel"));
  // Without a ByteLevel step the vocabulary is read as text, which the ByteLevel decoder cannot
  // decode.
  EXPECT_TRUE(contains(refused([](Json& j) { j["pre_tokenizer"] = nullptr; }),
                       "decoder.type is \"ByteLevel\"; ByteLevel decodes a byte-level BPE, and "
                       "this file's pre-tokenizer has no ByteLevel step"));
  const Json split = {
      {"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_TRUE(contains(
      refused([&](Json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split, j["pre_tokenizer"]}}};
      }),
      "pre_tokenizer.pretokenizers[0].behavior is \"Removed\""));
  EXPECT_TRUE(contains(
      refused([&](Json& j) {
        j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {j["pre_tokenizer"], split}}};
      }),
      "pre_tokenizer.pretokenizers[1] (Split) comes after the ByteLevel step"));
  EXPECT_TRUE(contains(
      refused([&](Json& j) {
        Json bad = split;
        bad["behavior"] = "Isolated";
        bad["pattern"] = {{"Regex", "(a"}};
        j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {bad, j["pre_tokenizer"]}}};
      }),
      "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: the split "
      "pattern \"(a\" is not a regular expression layup can run"));
  EXPECT_TRUE(contains(refused([&](Json& j) {
                         j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split}}};
                         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
                       }),
                       "this file's pre-tokenizer has no ByteLevel step"));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["decoder"] = {{"type", "WordPiece"}};
                       }),
                       "decoder.type is \"WordPiece\"; a byte-level BPE (pre-tokenizer ByteLevel) "
                       "is decoded by ByteLevel"));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["post_processor"] = {{"type", "BertProcessing"}};
                       }),
                       "post_processor.type is \"BertProcessing\""));
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["added_tokens"] = {added_token(257, "<s>", true)};
                         j["added_tokens"][0]["lstrip"] = true;
                       }),
                       "added_tokens[0].lstrip is true; layup supports only false"));
}

TEST(HfTokenizer, RefusesInconsistentVocabularies) {
  const auto refused = [](const std::function<void(Json&)>& change) {
    Json json = tokenizer_json({"ab"}, {"a b"});
    change(json);
    return load_error(json);
  };
  EXPECT_TRUE(contains(refused([](Json& j) {
                         j["model"]["vocab"].erase(spelled("\n"));
                         j["model"]["vocab"]["zz"] = byte_id('\n');
                       }),
                       "model.vocab has no token for the byte \"\\x0A\"; a byte-level BPE needs "
                       "one for each of the 256 bytes"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["vocab"]["zz"] = 300; }),
                       "no token has the id 257 (neither model.vocab nor added_tokens)"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["vocab"]["zz"] = 256; }), "the id 256"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["vocab"]["z"] = -1; }),
                       "model.vocab gives the token \"z\" the id -1"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["vocab"]["☃"] = 257; }),
                       "has the character U+2603, which is not in GPT-2's byte alphabet"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["merges"].push_back("a q"); }),
                       "model.merges[1] (\"a\" + \"q\") makes \"aq\", which is not a token of "
                       "model.vocab"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["merges"].push_back("a b"); }),
                       "model.merges[1] (\"a\" + \"b\") repeats model.merges[0]"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["merges"].push_back("ab"); }),
                       "model.merges[1] is \"ab\"; expected two tokens separated by one space"));
  EXPECT_TRUE(contains(refused([](Json& j) { j["model"]["merges"].push_back(Json::array({"a"})); }),
                       "model.merges[1] is array [\"a\"]"));
  EXPECT_TRUE(contains(
      refused([](Json& j) {
        j["added_tokens"] = {added_token(257, "<s>", true), added_token(257, "</s>", true)};
      }),
      "added tokens \"<s>\" and \"</s>\" both have id 257"));
  EXPECT_TRUE(
      contains(refused([](Json& j) { j["added_tokens"] = {added_token(256, "<s>", true)}; }),
               "the id 256 is the added token \"<s>\" and the model.vocab token \"ab\""));
  EXPECT_TRUE(contains(load_error(Json::array()),
                       "tokenizer.json: the top level must be a JSON object, found array []"));
  EXPECT_TRUE(contains(error_message([] { HfTokenizer::from_json("{\"model\":", "t.json"); }),
                       "t.json: not valid JSON"));
  EXPECT_TRUE(contains(error_message([] { HfTokenizer::from_json("", "t.json"); }),
                       "t.json: the file is empty"));
}

}  // namespace
}  // namespace layup
