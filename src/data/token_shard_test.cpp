// Tests of the token shard format: round trips, the exact llm.c layouts (uint16 and uint32), and
// an error (that changes no file) for every kind of damaged or foreign file.
#include "data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <span>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

// A shard file from raw header fields and tokens, without any checking.
template <class TokenId = uint16_t>
std::string raw_shard(int32_t magic, int32_t version, int32_t count,
                      const std::vector<TokenId>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(TokenId));
  return bytes;
}

// Reads `contents` as a shard and returns the error message; the directory must be unchanged.
std::string shard_error(const std::string& contents, int vocab_size = 50257) {
  TempDir dir;
  const std::string path = dir.file("shard.bin");
  write_text(path, contents);
  const auto before = snapshot(dir.path());
  const std::string message = error_message([&] { read_token_shard(path, vocab_size); });
  EXPECT_TRUE(contains(message, path));
  EXPECT_EQ(snapshot(dir.path()), before);
  return message;
}

TEST(TokenShard, RoundTripInLlmcLayout) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {50256, 464, 2068, 7586, 21831, 0, 65535 % 50257};
  write_token_shard(dir.file("train_000000.bin"), tokens);
  EXPECT_EQ(read_text(dir.file("train_000000.bin")), raw_shard(20240520, 1, 7, tokens));
  EXPECT_EQ(read_token_shard(dir.file("train_000000.bin"), 50257), tokens);
  EXPECT_EQ(snapshot(dir.path()).size(), 1u);
}

TEST(TokenShard, Uint32RoundTripInLlmcsLlama3Layout) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {128000, 9906, 1917, 0, 65535, 65536, 128255};
  write_token_shard(dir.file("train_000000.bin"), std::span<const uint32_t>(tokens));
  EXPECT_EQ(read_text(dir.file("train_000000.bin")), raw_shard(20240801, 7, 7, tokens));
  EXPECT_EQ(read_token_shard_as_uint32(dir.file("train_000000.bin"), 128256), tokens);
  // Read against a vocabulary too small for its ids, the shard is refused, in either width.
  EXPECT_TRUE(
      contains(error_message([&] { read_token_shard(dir.file("train_000000.bin"), 65536); }),
               "has token id 128000 at position 0, outside the vocabulary of 65536"));
  EXPECT_TRUE(contains(
      error_message([&] { read_token_shard_as_uint32(dir.file("train_000000.bin"), 128000); }),
      "has token id 128000 at position 0"));
  EXPECT_TRUE(
      contains(error_message([&] { read_token_shard(dir.file("train_000000.bin"), 70000); }),
               "against a vocabulary of 70000 tokens (expected 1..65536)"));
}

TEST(TokenShard, EitherLayoutReadsInEitherWidth) {
  TempDir dir;
  const std::vector<uint16_t> narrow = {3, 1, 4, 1, 5};
  const std::vector<uint32_t> wide(narrow.begin(), narrow.end());
  write_token_shard(dir.file("narrow.bin"), std::span<const uint16_t>(narrow));
  write_token_shard(dir.file("wide.bin"), std::span<const uint32_t>(wide));
  EXPECT_EQ(read_token_shard(dir.file("wide.bin"), 50257), narrow);
  EXPECT_EQ(read_token_shard_as_uint32(dir.file("narrow.bin"), 50257), wide);
  EXPECT_EQ(read_token_shard_as_uint32(dir.file("wide.bin"), 200000), wide);
}

TEST(TokenShard, WritingNoTokensIsAnError) {
  TempDir dir;
  EXPECT_TRUE(contains(
      error_message([&] { write_token_shard(dir.file("e.bin"), std::span<const uint16_t>()); }),
      "no tokens to write"));
  EXPECT_TRUE(contains(
      error_message([&] { write_token_shard(dir.file("e.bin"), std::span<const uint32_t>()); }),
      "no tokens to write"));
  EXPECT_TRUE(snapshot(dir.path()).empty());
}

TEST(TokenShard, MissingFile) {
  TempDir dir;
  const std::string message = error_message([&] { read_token_shard(dir.file("nope.bin"), 100); });
  EXPECT_TRUE(contains(message, "cannot open token shard " + dir.file("nope.bin")));
  EXPECT_TRUE(contains(message, "No such file"));
}

TEST(TokenShard, EmptyFile) {
  EXPECT_TRUE(contains(shard_error(""), "is empty (0 bytes)"));
}

TEST(TokenShard, ShorterThanHeader) {
  const std::string message = shard_error(raw_shard(20240520, 1, 3, {}).substr(0, 100));
  EXPECT_TRUE(contains(message, "has 100 bytes, fewer than the 1024-byte header"));
}

TEST(TokenShard, WrongMagic) {
  const std::string message = shard_error(raw_shard(12345, 1, 2, {1, 2}));
  EXPECT_TRUE(contains(message, "is not a layup/llm.c token shard"));
  EXPECT_TRUE(contains(message, "starts with the number 12345"));
  EXPECT_TRUE(contains(message, "magic number 20240520 (uint16 ids) or 20240801 (uint32 ids)"));
  // A text file is not a shard either.
  EXPECT_TRUE(contains(shard_error(std::string(2000, 'a')), "not a layup/llm.c token shard"));
}

TEST(TokenShard, WrongVersion) {
  EXPECT_TRUE(contains(shard_error(raw_shard(20240520, 2, 2, {1, 2, 3, 4})),
                       "has version 2; layup reads version 1 under the magic number 20240520"));
  EXPECT_TRUE(contains(shard_error(raw_shard(20240801, 1, 2, {1, 2, 3, 4})),
                       "has version 1; layup reads version 7 under the magic number 20240801"));
}

TEST(TokenShard, ZeroTokens) {
  EXPECT_TRUE(contains(shard_error(raw_shard(20240520, 1, 0, {})), "declares 0 tokens"));
  EXPECT_TRUE(contains(shard_error(raw_shard(20240520, 1, -4, {})), "declares -4 tokens"));
}

TEST(TokenShard, Truncated) {
  const std::string message = shard_error(raw_shard(20240520, 1, 10, {1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(contains(message,
                       "is truncated: its header declares 10 tokens but the file holds "
                       "only 7 (14 bytes after the header, 2 per token)"));
  // Half a token at the end counts as truncation too.
  EXPECT_TRUE(contains(shard_error(raw_shard(20240520, 1, 2, {1, 2}).substr(0, 1027)),
                       "declares 2 tokens but the file holds only 1"));
}

TEST(TokenShard, TruncatedUint32Shard) {
  const std::string message = shard_error(raw_shard<uint32_t>(20240801, 7, 3, {1, 2}));
  EXPECT_TRUE(contains(message,
                       "is truncated: its header declares 3 tokens but the file holds only 2 (8 "
                       "bytes after the header, 4 per token)"));
  EXPECT_TRUE(contains(shard_error(raw_shard<uint32_t>(20240801, 7, 2, {1, 2}).substr(0, 1030)),
                       "declares 2 tokens but the file holds only 1"));
}

TEST(TokenShard, BytesAfterTheDeclaredTokens) {
  EXPECT_TRUE(contains(shard_error(raw_shard(20240520, 1, 2, {1, 2, 3})),
                       "has 2 bytes after the 2 tokens its header declares"));
}

TEST(TokenShard, TokenOutsideTheVocabulary) {
  const std::string message = shard_error(raw_shard(20240520, 1, 4, {5, 99, 100, 3}), 100);
  EXPECT_TRUE(contains(message,
                       "has token id 100 at position 2, outside the vocabulary of 100 "
                       "tokens"));
}

}  // namespace
}  // namespace layup
