// Tests of the tokenizer.json BPE model with a vocabulary spelled as text (SentencePiece-style):
// characters as the first parts, byte_fallback, unk_token with and without fuse_unk, characters
// dropped when there is neither, ignore_merges, and the errors of such a model.
#include "tokenizer/hf_bpe_model.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using Json = nlohmann::json;
using Ids = std::vector<int32_t>;
using test_files::contains;
using test_files::error_message;

// Llama 2's layout: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> (ids 3..258), then the
// rest: "▁" 259, "a" 260, "b" 261, "ab" 262, "▁ab" 263, "é" 264, "ba" 265 (no merge makes it).
Json model_json() {
  Json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int byte = 0; byte < 256; ++byte) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", byte);
    vocab[name] = 3 + byte;
  }
  const char* rest[] = {"\u2581", "a", "b", "ab", "\u2581ab", "\u00E9", "ba"};
  for (int i = 0; i < 7; ++i) vocab[rest[i]] = 259 + i;
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", "<unk>"},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", Json::array({Json::array({"a", "b"}), Json::array({"\u2581", "ab"})})}};
}

int32_t byte_token(unsigned char byte) {
  return 3 + byte;
}

Ids encoded(const Json& model, std::string_view piece) {
  Ids ids;
  HfBpeModel::read(model, false, "tokenizer.json").encode_piece(piece, ids);
  return ids;
}

TEST(HfBpeModel, CharactersMergeByTheList) {
  const Json model = model_json();
  EXPECT_EQ(encoded(model, "\u2581ab"), (Ids{263}));
  EXPECT_EQ(encoded(model, "ba\u00E9"), (Ids{261, 260, 264}));
  const HfBpeModel read = HfBpeModel::read(model, false, "tokenizer.json");
  EXPECT_EQ(read.id_end(), 266u);
  EXPECT_EQ(*read.token(263), "\u2581ab");  // the text itself, not GPT-2's byte alphabet
  EXPECT_EQ(read.spelling(4), "<0x01>");
}

TEST(HfBpeModel, ByteFallbackSpellsUnknownCharactersAsBytes) {
  const Json model = model_json();
  EXPECT_EQ(encoded(model, "a\U0001F600b"), (Ids{260, byte_token(0xF0), byte_token(0x9F),
                                                 byte_token(0x98), byte_token(0x80), 261}));
  EXPECT_EQ(encoded(model,
                    "\xFF"
                    "ab"),
            (Ids{byte_token(0xFF), 262}));  // an invalid byte too
}

TEST(HfBpeModel, UnknownCharactersBecomeUnkFusedOrNot) {
  Json model = model_json();
  model["byte_fallback"] = false;
  EXPECT_EQ(encoded(model, "xyab z"), (Ids{0, 262, 0}));
  model["fuse_unk"] = false;
  EXPECT_EQ(encoded(model, "xyab z"), (Ids{0, 0, 262, 0, 0}));
  // Neither unk_token nor byte_fallback: tokenizers drops the character.
  model["unk_token"] = nullptr;
  EXPECT_EQ(encoded(model, "xab"), (Ids{262}));
  EXPECT_EQ(encoded(model, "xyz"), (Ids{}));
}

TEST(HfBpeModel, ByteTokensGoInAheadOfAPendingUnk) {
  // Without <0xF0>, "😀" becomes <unk>; "é" then has no token of its own but its bytes, which
  // tokenizers puts in at once, before the <unk> it has not put in yet.
  Json model = model_json();
  model["vocab"].erase("<0xF0>");
  model["vocab"].erase("\u00E9");
  model["vocab"]["x"] = 3 + 0xF0;
  model["vocab"]["y"] = 264;
  EXPECT_EQ(encoded(model, "\U0001F600\u00E9a"), (Ids{byte_token(0xC3), byte_token(0xA9), 0, 260}));
  // Nor do they end the run of unknown characters that one <unk> stands for.
  EXPECT_EQ(encoded(model, "\U0001F600\u00E9\U0001F600a"),
            (Ids{byte_token(0xC3), byte_token(0xA9), 0, 260}));
}

TEST(HfBpeModel, IgnoreMergesTakesAPieceThatIsAToken) {
  Json model = model_json();
  EXPECT_EQ(encoded(model, "ba"), (Ids{261, 260}));
  model["ignore_merges"] = true;
  EXPECT_EQ(encoded(model, "ba"), (Ids{265}));
  EXPECT_EQ(encoded(model, "bab"), (Ids{261, 262}));
}

TEST(HfBpeModel, RefusesWhatItCannotEncode) {
  const auto refused = [](const std::function<void(Json&)>& change) {
    Json model = model_json();
    change(model);
    return error_message([&] { HfBpeModel::read(model, false, "tokenizer.json"); });
  };
  EXPECT_TRUE(contains(refused([](Json& m) { m["unk_token"] = "<UNK>"; }),
                       "tokenizer.json: model.unk_token is \"<UNK>\", which is not a token of "
                       "model.vocab"));
  EXPECT_TRUE(contains(refused([](Json& m) { m["end_of_word_suffix"] = "</w>"; }),
                       "model.end_of_word_suffix is \"</w>\"; layup supports only \"\""));
  EXPECT_TRUE(contains(refused([](Json& m) {
                         m["merges"].push_back(Json::array({"b", "b"}));
                       }),
                       "model.merges[2] (\"b\" + \"b\") makes \"bb\", which is not a token"));
}

}  // namespace
}  // namespace layup
