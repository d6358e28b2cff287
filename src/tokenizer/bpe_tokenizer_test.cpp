// Pins GPT-2's ids for a known string with both file forms, round trips, and that every kind of
// damage to a tokenizer file is a layup::Error naming the file.
#include "tokenizer/bpe_tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace layup {
namespace {

namespace fs = std::filesystem;

const std::string kTokenizerDir = LAYUP_DATA_DIR "/gpt2-tokenizer";
const std::string kTiktokenPath = kTokenizerDir + "/gpt2.tiktoken";
const std::string kEncoderPath = kTokenizerDir + "/encoder.json";
const std::string kMergesPath = kTokenizerDir + "/vocab.bpe";

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

// Loading is the slow part of these tests, so each form is loaded once.
const BpeTokenizer& tiktoken_tokenizer() {
  static const BpeTokenizer tokenizer = BpeTokenizer::from_tiktoken_file(kTiktokenPath);
  return tokenizer;
}
const BpeTokenizer& encoder_tokenizer() {
  static const BpeTokenizer tokenizer = BpeTokenizer::from_encoder_files(kEncoderPath, kMergesPath);
  return tokenizer;
}

TEST(BpeTokenizer, EncodesTheCheckStringWithBothFileForms) {
  const std::vector<int32_t> expected = {31373, 995, 0, 22197, 338, 3367, 45938};
  EXPECT_EQ(tiktoken_tokenizer().encode("hello world! Shakespeare's sonnets"), expected);
  EXPECT_EQ(encoder_tokenizer().encode("hello world! Shakespeare's sonnets"), expected);
}

TEST(BpeTokenizer, BothFileFormsLoadTheSameVocabulary) {
  const BpeTokenizer& a = tiktoken_tokenizer();
  const BpeTokenizer& b = encoder_tokenizer();
  ASSERT_EQ(a.vocab_size(), 50257);
  ASSERT_EQ(b.vocab_size(), 50257);
  EXPECT_EQ(a.eot_token(), 50256);
  EXPECT_EQ(b.eot_token(), 50256);
  for (int32_t id = 0; id < a.vocab_size(); ++id) {
    ASSERT_EQ(a.decode_token(id), b.decode_token(id)) << "token id " << id;
  }
  const std::string sample = read_file(LAYUP_DATA_DIR "/corpus/austen.txt").substr(0, 200000);
  EXPECT_EQ(a.encode(sample), b.encode(sample));
}

TEST(BpeTokenizer, EndOfTextInTheTextIsOrdinaryCharacters) {
  const BpeTokenizer& tokenizer = tiktoken_tokenizer();
  EXPECT_EQ(tokenizer.encode("<|endoftext|>"),
            (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tokenizer.decode_token(tokenizer.eot_token()), "<|endoftext|>");
}

TEST(BpeTokenizer, DecodeInvertsEncodeForHardStrings) {
  const BpeTokenizer& tokenizer = tiktoken_tokenizer();
  const std::vector<std::string> texts = {
      "",
      " ",
      "   leading and trailing   ",
      "they're THEY'RE don't I'll",
      "\t\t\n\n\r\n  \n",
      "1234567890 3.14159 x2y3",
      "你好，世界。日本語のテキスト",
      "👨‍👩‍👧‍👦 family, 👋🏽 wave, 🏳️‍🌈 flag",
      "مرحبا بالعالم",
      "cafe\u0301 na\u00efve",
      "<|endoftext|> is plain text here",
      "invalid \xff\xfe bytes \xc0\xaf and \xe2\x82 truncated \xed\xa0\x80 surrogate "
      "\xf4\x90\x80\x80",
      std::string("nul \0 inside", 12),
      std::string(100000, 'a'),  // one long piece: the merge loop must stay fast
      std::string(5000, ' ') + "x",
  };
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_EQ(tokenizer.decode(ids), text) << "text of " << text.size() << " bytes";
  }
}

TEST(BpeTokenizer, EncodesConcurrently) {
  const BpeTokenizer& tokenizer = tiktoken_tokenizer();
  const std::string sample = read_file(LAYUP_DATA_DIR "/corpus/kjv.txt").substr(0, 100000);
  const std::vector<int32_t> expected = tokenizer.encode(sample);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&] { result = tokenizer.encode(sample); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(BpeTokenizer, DecodeRejectsIdsOutOfRange) {
  const BpeTokenizer& tokenizer = tiktoken_tokenizer();
  for (int32_t id : {-1, 50257, 1 << 30}) {
    const std::vector<int32_t> ids = {31373, id};
    try {
      tokenizer.decode(ids);
      ADD_FAILURE() << "decoding id " << id << " did not throw";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(std::to_string(id)), std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(tokenizer.decode_token(50257), Error);
}

// Damaged copies of the shipped files, written into a fresh temporary directory per test.
class BpeTokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test_name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() /
           ("layup_tokenizer_test_" + std::to_string(getpid()) + "_" + test_name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    write_file(path, contents);
    return path;
  }

  // Expects load() to throw a layup::Error whose message names path and contains what.
  void expect_error(const std::function<void()>& load, const std::string& path,
                    const std::string& what) {
    try {
      load();
      ADD_FAILURE() << "loading " << path << " did not throw (expected \"" << what << "\")";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(path), std::string::npos) << "message: " << message;
      EXPECT_NE(message.find(what), std::string::npos) << "message: " << message;
    }
  }

  // A damaged gpt2.tiktoken: the shipped one with `from` replaced by `to` (once).
  void expect_tiktoken_error(const std::string& from, const std::string& to,
                             const std::string& what) {
    std::string contents = read_file(kTiktokenPath);
    const size_t at = contents.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    contents.replace(at, from.size(), to);
    const std::string path = write("gpt2.tiktoken", contents);
    expect_error([&] { BpeTokenizer::from_tiktoken_file(path); }, path, what);
  }

  void expect_encoder_error(const std::string& from, const std::string& to,
                            const std::string& what) {
    std::string contents = read_file(kEncoderPath);
    const size_t at = contents.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    contents.replace(at, from.size(), to);
    const std::string path = write("encoder.json", contents);
    expect_error([&] { BpeTokenizer::from_encoder_files(path, kMergesPath); }, path, what);
  }

  void expect_merges_error(const std::string& from, const std::string& to,
                           const std::string& what) {
    std::string contents = read_file(kMergesPath);
    const size_t at = contents.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    contents.replace(at, from.size(), to);
    const std::string path = write("vocab.bpe", contents);
    expect_error([&] { BpeTokenizer::from_encoder_files(kEncoderPath, path); }, path, what);
  }

  fs::path dir_;
};

TEST_F(BpeTokenizerFiles, MissingFilesAreNamed) {
  const std::string missing = (dir_ / "nope.tiktoken").string();
  expect_error([&] { BpeTokenizer::from_tiktoken_file(missing); }, missing, "cannot open");
  expect_error([&] { BpeTokenizer::load_dir(dir_.string()); }, "encoder.json", "gpt2.tiktoken");
  expect_error([&] { BpeTokenizer::load_dir(dir_.string()); }, dir_.string(), "vocab.bpe");
}

TEST_F(BpeTokenizerFiles, LoadDirFallsBackToEncoderFiles) {
  write("encoder.json", read_file(kEncoderPath));
  write("vocab.bpe", read_file(kMergesPath));
  EXPECT_EQ(BpeTokenizer::load_dir(dir_.string()).encode("hello world"),
            (std::vector<int32_t>{31373, 995}));
}

TEST_F(BpeTokenizerFiles, TiktokenEmpty) {
  const std::string path = write("gpt2.tiktoken", "");
  expect_error([&] { BpeTokenizer::from_tiktoken_file(path); }, path, "empty");
  const std::string blank = write("blank.tiktoken", "\n\n");
  expect_error([&] { BpeTokenizer::from_tiktoken_file(blank); }, blank, "no tokens");
}

TEST_F(BpeTokenizerFiles, TiktokenTruncated) {
  const std::string contents = read_file(kTiktokenPath);
  // Cut inside the last line's rank, and inside a token.
  const std::string cut_rank = write("cut_rank.tiktoken", contents.substr(0, contents.size() - 3));
  expect_error([&] { BpeTokenizer::from_tiktoken_file(cut_rank); }, cut_rank, "duplicate rank");
  const std::string cut_token =
      write("cut_token.tiktoken", contents.substr(0, contents.rfind(' ') - 2));
  expect_error([&] { BpeTokenizer::from_tiktoken_file(cut_token); }, cut_token, "no rank");
}

TEST_F(BpeTokenizerFiles, TiktokenBadLines) {
  expect_tiktoken_error("\nIg== 1\n", "\nI#== 1\n", ":2: bad base64");
  expect_tiktoken_error("\nIg== 1\n", "\nIg=\n", ":2: expected \"<base64> <rank>\"");
  expect_tiktoken_error("\nIg== 1\n", "\nIg== one\n", "not a non-negative integer");
  expect_tiktoken_error("\nIg== 1\n", "\nIg== -1\n", "not a non-negative integer");
}

TEST_F(BpeTokenizerFiles, TiktokenRanksNotDense) {
  expect_tiktoken_error("\nIg== 1\n", "\nIg== 0\n", "duplicate rank 0 (also on line 1)");
  expect_tiktoken_error("\nIg== 1\n", "\nIg== 50256\n", "rank 50256 is out of range");
}

TEST_F(BpeTokenizerFiles, TiktokenDuplicateOrMissingToken) {
  expect_tiktoken_error("\nIg== 1\n", "\nIQ== 1\n", "duplicate token \"!\" (ranks 0 and 1)");
  // "\"" replaced by a new multi-byte token leaves that byte without a token.
  expect_tiktoken_error("\nIg== 1\n", "\nAAAA 1\n", "no token for the byte \"\\\"\"");
}

TEST_F(BpeTokenizerFiles, EncoderJsonNotJson) {
  const std::string contents = read_file(kEncoderPath);
  const std::string truncated = write("encoder.json", contents.substr(0, contents.size() / 2));
  expect_error([&] { BpeTokenizer::from_encoder_files(truncated, kMergesPath); }, truncated,
               "not valid JSON");
  const std::string empty = write("empty.json", "");
  expect_error([&] { BpeTokenizer::from_encoder_files(empty, kMergesPath); }, empty, "empty");
  const std::string array = write("array.json", "[1, 2, 3]");
  expect_error([&] { BpeTokenizer::from_encoder_files(array, kMergesPath); }, array,
               "expected a JSON object");
}

TEST_F(BpeTokenizerFiles, EncoderJsonBadIds) {
  expect_encoder_error("\"!\": 0,", "\"!\": \"zero\",", "is \"zero\", not an integer");
  expect_encoder_error("\"!\": 0,", "\"!\": 1,", "both have id 1");
  expect_encoder_error("\"!\": 0,", "\"!\": 60000,", "has id 60000");
  expect_encoder_error(", \"<|endoftext|>\": 50256}", "}", "has no \"<|endoftext|>\"");
  expect_encoder_error("\"!\": 0,", "\"!\": 50256,", "both have id 50256");
}

TEST_F(BpeTokenizerFiles, EncoderJsonOutsideTheByteAlphabet) {
  expect_encoder_error("\"!\": 0,", "\"\\u4e00\": 0,", "U+4E00, which is not in GPT-2's byte");
}

TEST_F(BpeTokenizerFiles, MergesEmptyOrTruncated) {
  const std::string empty = write("vocab.bpe", "");
  expect_error([&] { BpeTokenizer::from_encoder_files(kEncoderPath, empty); }, empty, "empty");
  const std::string contents = read_file(kMergesPath);
  const std::string truncated = write("cut.bpe", contents.substr(0, contents.size() / 2));
  expect_error([&] { BpeTokenizer::from_encoder_files(kEncoderPath, truncated); }, truncated,
               "merge");
  const std::string whole_lines =
      write("lines.bpe", contents.substr(0, contents.rfind('\n', contents.size() / 2) + 1));
  expect_error([&] { BpeTokenizer::from_encoder_files(kEncoderPath, whole_lines); }, whole_lines,
               "truncated file?");
}

TEST_F(BpeTokenizerFiles, MergesBadLines) {
  expect_merges_error("\n\u0120 t\n", "\n\u0120t\n", ":2: expected two tokens");
  expect_merges_error("\n\u0120 t\n", "\n\u0120 zzqqzz\n", "uses \"zzqqzz\", which is not a token");
  expect_merges_error("\n\u0120 t\n", "\n\u0120t \u0120t\n", "makes a token that is not in");
  expect_merges_error("\n\u0120 a\n", "\n\u0120 t\n", ":3: duplicate merge");
  expect_merges_error("\n\u0120 t\n\u0120 a\n", "\n\u0120 a\n\u0120 t\n", "must make id 256");
}

}  // namespace
}  // namespace layup
