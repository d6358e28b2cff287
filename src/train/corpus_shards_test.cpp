// Tests of text -> token shards: the split of every file into training and validation tokens;
// that bad input (a missing, directory or empty file, a bad fraction, an output folder that is a
// file or holds older shards, too little text) is refused before anything is written, while a file
// that looks binary is tokenized with a warning; that older shards are replaced only on request;
// and that the shipped corpus's cache is keyed by the tokenizer's files and the text.
#include "train/corpus_shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "data/token_flags.h"
#include "data/token_shard.h"
#include "io/test_files.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/tokenizer.h"

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
                      const std::string& out = "",
                      ExistingShards existing = ExistingShards::kRefuse) {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] {
      write_corpus_shards(gpt2_tokenizer(), files, out.empty() ? out_ : out, val_fraction,
                          existing);
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
                       "a.jsonl: line 2: \"text\" is number, not a string"));
  EXPECT_TRUE(contains(refused({text_file("b.jsonl", text + text + "{not json\n")}),
                       "b.jsonl: line 3: the line starts with '{' but is not valid JSON"));
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
  // An existing output folder keeps what it held, even the shards --overwrite would replace, and
  // no staging folder is left in it.
  fs::create_directory(out_);
  write_text(out_ + "/train_000000.bin", "earlier shards");
  refused({short_text}, 0.05, out_, ExistingShards::kReplace);
  EXPECT_EQ(
      write_corpus_shards(gpt2_tokenizer(), {short_text}, out_, 0.25, ExistingShards::kReplace)
          .val_tokens,
      1u);
}

TEST_F(CorpusShards, OutputFolderThatIsAFileOrCannotBeMadeIsRefused) {
  const std::string good = text_file("good.txt", prose(50));
  const std::string file = text_file("taken", "a file");
  EXPECT_TRUE(contains(refused({good}, 0.05, file),
                       "the output folder (--out) " + file + " is an existing file, not a folder"));
  EXPECT_TRUE(contains(refused({good}, 0.05, file + "/shards"),
                       "cannot create the output folder (--out) " + file + "/shards: "));
}

TEST_F(CorpusShards, ShardsAlreadyInTheFolderAreRefusedByName) {
  const std::string good = text_file("good.txt", prose(50));
  fs::create_directory(out_);
  for (const char* name :
       {"train_000000.bin", "val_000000.bin", "fineweb_train_000001.bin", "extra.bin"})
    write_text(out_ + "/" + name, "older shard");
  const std::string message = refused({good});
  EXPECT_TRUE(contains(message, "the output folder (--out) " + out_ +
                                    " already holds 4 shards (extra.bin, "
                                    "fineweb_train_000001.bin, train_000000.bin and 1 more), "
                                    "which layup would read together with the new ones"));
  EXPECT_TRUE(contains(message, "add --overwrite to replace them, or give another --out"));
  // Files that are not shards do not stand in the way.
  TempDir other;
  write_text(other.file("notes.txt"), "notes");
  EXPECT_EQ(write_corpus_shards(gpt2_tokenizer(), {good}, other.path(), 0.05).files.size(), 2u);
}

TEST_F(CorpusShards, OverwriteReplacesEveryOlderShard) {
  const std::string good = text_file("good.txt", prose(50));
  fs::create_directory(out_);
  for (const char* name : {"train_000000.bin", "train_000001.bin", "val_000000.bin", "old.bin"})
    write_text(out_ + "/" + name, "older shard");
  write_text(out_ + "/notes.txt", "notes");
  const ShardSummary summary =
      write_corpus_shards(gpt2_tokenizer(), {good}, out_, 0.05, ExistingShards::kReplace);
  EXPECT_EQ(summary.removed.size(), 4u);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(out_))
    left.push_back(entry.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"notes.txt", "train_000000.bin", "val_000000.bin"}));
  std::vector<uint16_t> ids = read_token_shard(out_ + "/train_000000.bin", 50257);
  const std::vector<uint16_t> val = read_token_shard(out_ + "/val_000000.bin", 50257);
  ids.insert(ids.end(), val.begin(), val.end());
  std::vector<uint16_t> expected{static_cast<uint16_t>(gpt2_tokenizer().eot_token())};
  for (int32_t id : gpt2_tokenizer().encode(prose(50))) expected.push_back(id);
  EXPECT_EQ(ids, expected);
}

// Instruction lines put a flags file beside every shard, split with the shard; a file of several
// examples gives validation whole examples, a text file's validation part starts an example.
TEST_F(CorpusShards, InstructionDataGetsFlagsBesideEveryShard) {
  std::string lines;
  for (int i = 0; i < 10; ++i)
    lines += nlohmann::json({{"prompt", "Q" + std::to_string(i) + ": what is it?"},
                             {"completion", " It is " + std::to_string(i) + "."}})
                 .dump() +
             "\n";
  const std::string jsonl = text_file("pairs.jsonl", lines);
  const std::string text = text_file("book.txt", prose(10));
  const ExampleEncoding encoding{
      read_instruction_tokenizer_config(LAYUP_DATA_DIR "/gpt2-tokenizer"),
      LearnTokens::kCompletions};
  const ShardSummary summary = write_corpus_shards(gpt2_tokenizer(), {jsonl, text}, out_, 0.25,
                                                   ExistingShards::kRefuse, 40, encoding);
  EXPECT_TRUE(summary.with_flags);

  // What each file tokenizes to, and where its validation part begins.
  const ExampleEncoder encoder(gpt2_tokenizer(), encoding.tokenizer_config, encoding.learn);
  std::vector<int32_t> pair_ids, text_ids;
  std::vector<uint8_t> pair_flags, text_flags;
  size_t pair_val_start = 0;
  std::vector<size_t> pair_starts;
  for (const InstructionExample& example : parse_jsonl_examples(lines, "pairs.jsonl")) {
    pair_starts.push_back(pair_ids.size());
    encoder.encode(example, "", pair_ids, pair_flags);
  }
  const size_t wanted_val_start = pair_ids.size() - pair_ids.size() / 4;
  pair_val_start = *std::lower_bound(pair_starts.begin(), pair_starts.end(), wanted_val_start);
  encoder.encode(parse_example_line(prose(10), ""), "", text_ids, text_flags);
  const size_t text_val_start = text_ids.size() - text_ids.size() / 4;
  text_flags[text_val_start] |= kTokenExampleStart;

  std::vector<uint16_t> train_ids, val_ids;
  std::vector<uint8_t> train_flags, val_flags;
  for (const std::string& path : summary.files) {
    if (!path.ends_with(".bin")) continue;
    const std::vector<uint16_t> ids = read_token_shard(path, 50257);
    EXPECT_LE(ids.size(), 40u);
    const std::vector<uint8_t> flags = read_token_flags(token_flags_path(path), ids.size());
    const bool is_val = fs::path(path).filename().string().starts_with("val_");
    (is_val ? val_ids : train_ids)
        .insert((is_val ? val_ids : train_ids).end(), ids.begin(), ids.end());
    (is_val ? val_flags : train_flags)
        .insert((is_val ? val_flags : train_flags).end(), flags.begin(), flags.end());
  }
  const auto part = [](const auto& all, size_t begin, size_t end) {
    return std::vector<typename std::decay_t<decltype(all)>::value_type>(all.begin() + begin,
                                                                         all.begin() + end);
  };
  std::vector<int32_t> expected_train = part(pair_ids, 0, pair_val_start);
  std::vector<uint8_t> expected_train_flags = part(pair_flags, 0, pair_val_start);
  for (size_t t = 0; t < text_val_start; ++t) {
    expected_train.push_back(text_ids[t]);
    expected_train_flags.push_back(text_flags[t]);
  }
  std::vector<int32_t> expected_val = part(pair_ids, pair_val_start, pair_ids.size());
  std::vector<uint8_t> expected_val_flags = part(pair_flags, pair_val_start, pair_ids.size());
  for (size_t t = text_val_start; t < text_ids.size(); ++t) {
    expected_val.push_back(text_ids[t]);
    expected_val_flags.push_back(text_flags[t]);
  }
  EXPECT_EQ(std::vector<int32_t>(train_ids.begin(), train_ids.end()), expected_train);
  EXPECT_EQ(train_flags, expected_train_flags);
  EXPECT_EQ(std::vector<int32_t>(val_ids.begin(), val_ids.end()), expected_val);
  EXPECT_EQ(val_flags, expected_val_flags);
  EXPECT_EQ(summary.train_learned_tokens,
            static_cast<size_t>(std::count_if(train_flags.begin(), train_flags.end(),
                                              [](uint8_t flag) { return flag & kTokenLearn; })));
  EXPECT_LT(summary.train_learned_tokens, train_ids.size());

  // Text alone again: --overwrite removes the flags files too, which would not fit the new shards.
  const ShardSummary text_only =
      write_corpus_shards(gpt2_tokenizer(), {text}, out_, 0.25, ExistingShards::kReplace);
  EXPECT_FALSE(text_only.with_flags);
  for (const auto& entry : fs::directory_iterator(out_))
    EXPECT_NE(entry.path().extension(), ".flags") << entry.path();
  // And flags files alone stand in the way of a tokenize without --overwrite.
  write_text(out_ + "/train_000009.flags", "older flags");
  EXPECT_TRUE(contains(refused({text}, 0.25, out_), "already holds 3 shards"));
}

// The default run's cache of the shipped corpus, under a corpus and a cache folder of the test's.
class DefaultShardDir : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.file("data/corpus"));
    write_text(dir_.file("data/corpus/a.txt"), prose(60));
    write_text(dir_.file("data/corpus/b.txt"), prose(40));
    set_shipped_data_dir(dir_.file("data"));
    set("XDG_CACHE_HOME", dir_.file("cache"), saved_cache_);
  }
  void TearDown() override {
    set_shipped_data_dir("");
    restore("XDG_CACHE_HOME", saved_cache_);
  }

  // default_shard_dir's folder, and what it said.
  std::pair<std::string, std::string> cache_of(const std::string& tokenizer_path) {
    char* text = nullptr;
    size_t size = 0;
    std::FILE* log = open_memstream(&text, &size);
    const std::string dir = default_shard_dir(*load_tokenizer(tokenizer_path), tokenizer_path, log);
    std::fclose(log);
    const std::string said(text, size);
    std::free(text);
    return {dir, said};
  }

  std::vector<std::string> cache_entries() {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_.file("cache/layup/shards")))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  TempDir dir_;
  const std::string shipped_ = LAYUP_DATA_DIR "/gpt2-tokenizer";

 private:
  static void set(const char* name, const std::string& value, std::optional<std::string>& saved) {
    if (const char* old = std::getenv(name)) saved = old;
    ::setenv(name, value.c_str(), 1);
  }
  static void restore(const char* name, const std::optional<std::string>& saved) {
    if (saved) {
      ::setenv(name, saved->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  std::optional<std::string> saved_cache_;
};

TEST_F(DefaultShardDir, IsMadeOnceAndReused) {
  const auto [made, making] = cache_of(shipped_);
  EXPECT_TRUE(contains(
      making, "data: tokenizing the shipped corpus (2 files) with " + shipped_ + " into " + made));
  EXPECT_EQ(fs::path(made).parent_path(), fs::path(dir_.file("cache/layup/shards")));
  EXPECT_TRUE(fs::path(made).filename().string().starts_with("shipped-corpus-"));
  std::vector<uint16_t> ids = read_token_shard(made + "/train_000000.bin", 50257);
  const std::vector<uint16_t> val = read_token_shard(made + "/val_000000.bin", 50257);
  ids.insert(ids.end(), val.begin(), val.end());
  std::vector<uint16_t> expected;
  for (int sentences : {60, 40}) {
    expected.push_back(static_cast<uint16_t>(gpt2_tokenizer().eot_token()));
    for (int32_t id : gpt2_tokenizer().encode(prose(sentences))) expected.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(ids, expected);

  const auto before = snapshot(made);
  const auto [reused, reusing] = cache_of(shipped_);
  EXPECT_EQ(reused, made);
  EXPECT_EQ(reusing,
            "data: the shipped corpus as " + shipped_ + " tokenizes it, cached in " + made + "\n");
  EXPECT_EQ(snapshot(made), before);
  EXPECT_EQ(cache_entries().size(), 1u) << "no staging folder is left";
}

TEST_F(DefaultShardDir, AnotherTokenizerOrTextGetsACacheOfItsOwn) {
  const std::string first = cache_of(shipped_).first;
  // The same tokenizer in its other file form still counts as another: the key is the files.
  fs::create_directory(dir_.file("encoder-form"));
  fs::copy_file(shipped_ + "/encoder.json", dir_.file("encoder-form/encoder.json"));
  fs::copy_file(shipped_ + "/vocab.bpe", dir_.file("encoder-form/vocab.bpe"));
  const std::string second = cache_of(dir_.file("encoder-form")).first;
  EXPECT_NE(second, first);
  write_text(dir_.file("data/corpus/b.txt"), prose(41));
  const std::string third = cache_of(shipped_).first;
  EXPECT_NE(third, first);
  EXPECT_NE(third, second);
  EXPECT_EQ(cache_entries().size(), 3u);
}

// A `train --data FILE` cache changes with the file, the tokenizer's config (EOS, chat template)
// and --learn; the same inputs find it again.
TEST_F(DefaultShardDir, DataFileCacheIsKeyedByFileConfigAndLearn) {
  fs::create_directory(dir_.file("tok"));
  fs::copy_file(shipped_ + "/gpt2.tiktoken", dir_.file("tok/gpt2.tiktoken"));
  write_text(dir_.file("tok/tokenizer_config.json"), R"({"eos_token": "<|endoftext|>"})");
  std::string lines;
  for (int i = 0; i < 40; ++i)
    lines += nlohmann::json({{"prompt", prose(1)}, {"completion", " yes"}}).dump() + "\n";
  const std::string data = dir_.file("pairs.jsonl");
  write_text(data, lines);
  const auto cache = [&](LearnTokens learn) {
    const std::string tokenizer = dir_.file("tok");
    const ExampleEncoding encoding{read_instruction_tokenizer_config(tokenizer), learn};
    std::FILE* log = std::fopen("/dev/null", "w");
    const std::string made =
        data_file_shard_dir(*load_tokenizer(tokenizer), tokenizer, data, encoding, log);
    std::fclose(log);
    return made;
  };
  const std::string first = cache(LearnTokens::kCompletions);
  EXPECT_TRUE(fs::path(first).filename().string().starts_with("pairs-"));
  EXPECT_TRUE(fs::exists(first + "/train_000000.flags"));
  EXPECT_EQ(cache(LearnTokens::kCompletions), first);
  const std::string all = cache(LearnTokens::kAll);
  EXPECT_NE(all, first);
  write_text(dir_.file("tok/tokenizer_config.json"), R"({"eos_token": "<|endoftext|>", "x": 1})");
  const std::string config = cache(LearnTokens::kCompletions);
  write_text(dir_.file("tok/chat_template.jinja"), "{{ messages }}");
  const std::string chat_template = cache(LearnTokens::kCompletions);
  write_text(data, lines + lines);
  const std::string text = cache(LearnTokens::kCompletions);
  const std::vector<std::string> made = {first, all, config, chat_template, text};
  EXPECT_EQ(std::set<std::string>(made.begin(), made.end()).size(), made.size());
  EXPECT_TRUE(is_data_file(data));
  EXPECT_FALSE(is_data_file(dir_.path()));
  EXPECT_FALSE(is_data_file(first + "/train_000000.bin"));
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
