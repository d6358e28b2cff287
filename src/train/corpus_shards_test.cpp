// Tests of text -> token shards: the split of every file into training and validation tokens, and
// that bad input (a missing, directory or empty file, a bad fraction, an output folder that is a
// file, too little text) is refused before anything is written, while a file that looks binary is
// tokenized with a warning.
#include "train/corpus_shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "data/token_shard.h"
#include "io/test_files.h"
#include "tokenizer/bpe_tokenizer.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

const BpeTokenizer& gpt2_tokenizer() {
  static const BpeTokenizer tokenizer = BpeTokenizer::load_dir(LAYUP_DATA_DIR "/gpt2-tokenizer");
  return tokenizer;
}

std::string prose(int sentences) {
  std::string text;
  for (int i = 0; i < sentences; ++i) text += "It is a truth universally acknowledged. ";
  return text;
}

class CorpusShards : public ::testing::Test {
 protected:
  std::string text_file(const std::string& name, const std::string& contents) {
    write_text(dir_.file(name), contents);
    return dir_.file(name);
  }

  // Runs write_corpus_shards, expects a layup::Error, and checks that no file changed.
  std::string refused(const std::vector<std::string>& files, double val_fraction = 0.05,
                      const std::string& out = "") {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] {
      write_corpus_shards(gpt2_tokenizer(), files, out.empty() ? out_ : out, val_fraction);
    });
    EXPECT_EQ(snapshot(dir_.path()), before);
    return message;
  }

  TempDir dir_;
  std::string out_ = dir_.file("shards");
};

TEST_F(CorpusShards, KeepsTheEndOfEveryFileForValidation) {
  const std::string texts[] = {prose(20), prose(7)};
  const std::vector<std::string> files = {text_file("a.txt", texts[0]),
                                          text_file("b.txt", texts[1])};
  const ShardSummary summary = write_corpus_shards(gpt2_tokenizer(), files, out_ + "/new/", 0.1);

  std::vector<uint16_t> train, val;
  for (const std::string& text : texts) {
    std::vector<int32_t> ids{gpt2_tokenizer().eot_token()};
    for (int32_t id : gpt2_tokenizer().encode(text)) ids.push_back(id);
    const size_t val_count = static_cast<size_t>(std::floor(ids.size() * 0.1));
    ASSERT_GE(val_count, 1u);
    train.insert(train.end(), ids.begin(), ids.end() - val_count);
    val.insert(val.end(), ids.end() - val_count, ids.end());
  }
  const std::string out = out_ + "/new";
  EXPECT_EQ(summary.files,
            (std::vector<std::string>{out + "/train_000000.bin", out + "/val_000000.bin"}));
  EXPECT_EQ(summary.train_tokens, train.size());
  EXPECT_EQ(summary.val_tokens, val.size());
  EXPECT_EQ(read_token_shard(out + "/train_000000.bin", 50257), train);
  EXPECT_EQ(read_token_shard(out + "/val_000000.bin", 50257), val);
  EXPECT_EQ(snapshot(out).size(), 2u);  // no staging folder left behind
}

// A .jsonl file is a document per line (its "text"), each after the separator, split as one file.
TEST_F(CorpusShards, JsonLinesAreADocumentPerLine) {
  const std::string first = prose(9), second = "Call me \"Ishmael\".\nSome years ago.";
  const std::string file =
      text_file("set.jsonl", nlohmann::json({{"text", first}, {"id", 1}}).dump() + "\n\n" +
                                 nlohmann::json({{"text", second}}).dump() + "\n");
  const ShardSummary summary = write_corpus_shards(gpt2_tokenizer(), {file}, out_, 0.1);

  std::vector<uint16_t> ids;
  for (const std::string& document : {first, second}) {
    ids.push_back(static_cast<uint16_t>(gpt2_tokenizer().eot_token()));
    for (int32_t id : gpt2_tokenizer().encode(document)) ids.push_back(static_cast<uint16_t>(id));
  }
  const size_t val_count = static_cast<size_t>(std::floor(ids.size() * 0.1));
  EXPECT_EQ(summary.val_tokens, val_count);
  EXPECT_EQ(read_token_shard(out_ + "/train_000000.bin", 50257),
            std::vector<uint16_t>(ids.begin(), ids.end() - val_count));
  EXPECT_EQ(read_token_shard(out_ + "/val_000000.bin", 50257),
            std::vector<uint16_t>(ids.end() - val_count, ids.end()));
}

TEST_F(CorpusShards, JsonLinesWithoutTextAreRefusedByLine) {
  const std::string text = "{\"text\": \"" + prose(5) + "\"}\n";
  EXPECT_TRUE(contains(refused({text_file("a.jsonl", text + "{\"text\": 3}\n")}),
                       "a.jsonl: line 2 has no \"text\" string ({\"text\": 3})"));
  EXPECT_TRUE(contains(refused({text_file("b.jsonl", text + text + "not json\n")}),
                       "b.jsonl: line 3 is not valid JSON"));
}

TEST_F(CorpusShards, InputThatIsNotATextFileIsNamed) {
  const std::string good = text_file("good.txt", prose(50));
  fs::create_directory(dir_.file("folder"));
  const struct {
    std::string path, expected;
  } cases[] = {
      {dir_.file("missing.txt"), ": it does not exist"},
      {dir_.file("folder"), ": it is a directory; give the text files in it instead"},
      {text_file("empty.txt", ""), ": it has no text (it is empty); leave it out"},
      {text_file("blank.txt", " \n\t\r\n"), ": it has no text (5 bytes of whitespace)"},
      {"/dev/null", ": it is not a regular file"},
  };
  for (const auto& c : cases) {
    const std::string message = refused({good, c.path});
    EXPECT_TRUE(contains(message, "cannot tokenize " + c.path + c.expected));
    EXPECT_FALSE(fs::exists(out_));
  }
  if (::geteuid() != 0) {  // root reads every file
    const std::string locked = text_file("locked.txt", prose(5));
    fs::permissions(locked, fs::perms::none);
    EXPECT_TRUE(contains(refused({good, locked}), "cannot tokenize " + locked +
                                                      ": it cannot be "
                                                      "opened"));
  }
}

TEST_F(CorpusShards, ValFractionMustLieBetweenZeroAndOne) {
  const std::string good = text_file("good.txt", prose(50));
  for (double fraction : {0.0, 1.0, -0.5, 2.0, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_TRUE(contains(refused({good}, fraction), "--val-fraction must lie in (0, 1), got "));
  }
  EXPECT_FALSE(fs::exists(out_));
}

TEST_F(CorpusShards, TooLittleTextForOneValidationTokenIsRefused) {
  // "Hello world." is 3 tokens, 4 with the end-of-text token: 5% of 4 rounds down to 0.
  const std::string short_text = text_file("short.txt", "Hello world.");
  const std::string message = refused({short_text, short_text});
  EXPECT_TRUE(contains(message, "no validation tokens: each file keeps the last 0.05 of its"));
  EXPECT_TRUE(contains(message, "the longest has 4 tokens; one needs at least 20"));
  EXPECT_TRUE(contains(message, "give more text or a larger --val-fraction"));
  EXPECT_FALSE(fs::exists(out_));
  // An existing output folder keeps what it held, and no staging folder is left in it.
  fs::create_directory(out_);
  write_text(out_ + "/train_000000.bin", "earlier shards");
  refused({short_text});
  EXPECT_EQ(write_corpus_shards(gpt2_tokenizer(), {short_text}, out_, 0.25).val_tokens, 1u);
}

TEST_F(CorpusShards, OutputFolderThatIsAFileOrCannotBeMadeIsRefused) {
  const std::string good = text_file("good.txt", prose(50));
  const std::string file = text_file("taken", "a file");
  EXPECT_TRUE(contains(refused({good}, 0.05, file),
                       "the output folder (--out) " + file + " is an existing file, not a folder"));
  EXPECT_TRUE(contains(refused({good}, 0.05, file + "/shards"),
                       "cannot create the output folder (--out) " + file + "/shards: "));
}

TEST_F(CorpusShards, BinaryLookingFilesAreTokenizedWithAWarning) {
  std::string latin1 = prose(20);
  latin1[10] = '\xe9';  // a few bytes of a legacy encoding are text, not binary
  const std::string with_nul = text_file("nul.txt", prose(20) + std::string(1, '\0') + "tail");
  std::string noise = prose(5);
  for (int i = 0; i < 200; ++i) noise += '\xff';
  const std::vector<std::string> files = {text_file("latin1.txt", latin1), with_nul,
                                          text_file("noise.bin", noise)};
  ::testing::internal::CaptureStderr();
  const ShardSummary summary = write_corpus_shards(gpt2_tokenizer(), files, out_, 0.05);
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(summary.files.size(), 2u);
  EXPECT_FALSE(contains(warnings, "latin1.txt"));
  EXPECT_TRUE(contains(warnings, "warning: " + with_nul + " looks binary (a NUL byte at offset " +
                                     std::to_string(prose(20).size()) +
                                     "); it is tokenized all the same"));
  EXPECT_TRUE(contains(warnings, "warning: " + files[2] +
                                     " looks binary (50% of its bytes are "
                                     "not valid UTF-8)"));
}

}  // namespace
}  // namespace layup
