// Tests of token cache keys: any change to the tokenizer's files, the text, its order or the
// settings gives another key; the same inputs the same key, wherever the files lie.
#include "data/token_cache_key.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io/test_files.h"
#include "tokenizer/tokenizer.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;
using test_files::TempDir;
using test_files::write_text;

class TokenCacheKey : public ::testing::Test {
 protected:
  std::string file(const std::string& name, const std::string& contents) {
    fs::create_directories(fs::path(dir_.file(name)).parent_path());
    write_text(dir_.file(name), contents);
    return dir_.file(name);
  }

  TempDir dir_;
};

TEST_F(TokenCacheKey, SameInputsGiveTheSameKeyWhereverTheyLie) {
  const std::string key = token_cache_key({file("a/vocab.json", "tokens")},
                                          {file("a/text.txt", "some text")}, "split=0.05");
  EXPECT_EQ(key.size(), 16u);
  EXPECT_EQ(key, token_cache_key({file("b/vocab.json", "tokens")},
                                 {file("b/text.txt", "some text")}, "split=0.05"));
}

TEST_F(TokenCacheKey, AnyChangeGivesAnotherKey) {
  const std::string tokenizer = file("vocab.json", "tokens");
  const std::string text = file("text.txt", "some text, long enough to span several words");
  const std::string other = file("other.txt", "more");
  const std::string key = token_cache_key({tokenizer}, {text, other}, "split=0.05");
  EXPECT_NE(key, token_cache_key({file("vocab2.json", "tokens")}, {text, other}, "split=0.05"))
      << "the tokenizer file's name (its format) counts";
  EXPECT_NE(key, token_cache_key({file("t/vocab.json", "tokenS")}, {text, other}, "split=0.05"));
  EXPECT_NE(key, token_cache_key({tokenizer}, {other, text}, "split=0.05")) << "the order counts";
  EXPECT_NE(key, token_cache_key({tokenizer}, {text}, "split=0.05"));
  EXPECT_NE(key, token_cache_key({tokenizer}, {text, other}, "split=0.1"));
  EXPECT_NE(key, token_cache_key({}, {tokenizer, text, other}, "split=0.05"))
      << "a tokenizer file is not a text file";
  // One byte changed, anywhere, and one byte added: a zero at the end is not padding.
  const std::string original = "some text, long enough to span several words";
  for (size_t position : {size_t{0}, size_t{7}, original.size() - 1}) {
    std::string changed = original;
    changed[position] ^= 1;
    EXPECT_NE(key, token_cache_key({tokenizer}, {file("c/text.txt", changed), other}, "split=0.05"))
        << position;
  }
  EXPECT_NE(key, token_cache_key({tokenizer}, {file("d/text.txt", original + '\0'), other},
                                 "split=0.05"));
}

TEST_F(TokenCacheKey, LargeFilesAreReadWhole) {
  std::string text(3 << 20, 'x');  // over the reader's chunk
  const std::string key = token_cache_key({}, {file("big.txt", text)}, "");
  text[(3 << 20) - 5] = 'y';
  EXPECT_NE(key, token_cache_key({}, {file("e/big.txt", text)}, ""));
}

TEST_F(TokenCacheKey, AnUnreadableFileIsNamed) {
  const std::string missing = dir_.file("missing.txt");
  EXPECT_TRUE(contains(error_message([&] { token_cache_key({}, {missing}, ""); }), missing));
}

TEST(TokenizerSourceFiles, AreTheFilesTheTokenizerIsLoadedFrom) {
  TempDir dir;
  const fs::path shipped = fs::path(LAYUP_DATA_DIR) / "gpt2-tokenizer";
  EXPECT_EQ(tokenizer_source_files(shipped.string()),
            std::vector<std::string>{(shipped / "gpt2.tiktoken").string()});
  fs::copy_file(shipped / "encoder.json", dir.file("encoder.json"));
  fs::copy_file(shipped / "vocab.bpe", dir.file("vocab.bpe"));
  EXPECT_EQ(tokenizer_source_files(dir.path()),
            (std::vector<std::string>{dir.file("encoder.json"), dir.file("vocab.bpe")}));
  TempDir hub;
  write_text(hub.file("tokenizer.json"), "{}");
  EXPECT_EQ(tokenizer_source_files(hub.path()),
            std::vector<std::string>{hub.file("tokenizer.json")});
  EXPECT_EQ(tokenizer_source_files(hub.file("tokenizer.json")),
            std::vector<std::string>{hub.file("tokenizer.json")});
  EXPECT_TRUE(contains(error_message([&] { tokenizer_source_files(hub.file("nothing")); }),
                       hub.file("nothing")));
}

}  // namespace
}  // namespace layup
