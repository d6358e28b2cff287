// Tests of the per-token flags file: the exact layout, a round trip, and an error for every kind of
// file that does not belong to its shard.
#include "data/token_flags.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::TempDir;
using test_files::write_text;

std::string raw_flags(int32_t magic, int32_t version, int32_t count,
                      const std::vector<uint8_t>& flags) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::string bytes(reinterpret_cast<const char*>(header.data()), 1024);
  bytes.append(reinterpret_cast<const char*>(flags.data()), flags.size());
  return bytes;
}

TEST(TokenFlags, PathSitsBesideTheShard) {
  EXPECT_EQ(token_flags_path("data/train_000000.bin"), "data/train_000000.flags");
  EXPECT_EQ(token_flags_path("data/tokens"), "data/tokens.flags");
}

TEST(TokenFlags, WritesTheDocumentedLayoutAndReadsItBack) {
  TempDir dir;
  const std::string path = dir.file("train_000000.flags");
  const std::vector<uint8_t> flags = {kTokenExampleStart, 0, kTokenLearn,
                                      kTokenExampleStart | kTokenLearn, kTokenLearn};
  write_token_flags(path, flags);
  EXPECT_EQ(read_text(path), raw_flags(20261205, 1, 5, {2, 0, 1, 3, 1}));
  EXPECT_EQ(read_token_flags(path, 5), flags);
}

TEST(TokenFlags, RefusesWhatIsNotItsShardsFlags) {
  TempDir dir;
  const std::string path = dir.file("x.flags");
  const auto read_error = [&](const std::string& contents, size_t count) {
    write_text(path, contents);
    return error_message([&] { read_token_flags(path, count); });
  };
  EXPECT_TRUE(contains(read_error(raw_flags(20261205, 1, 3, {1, 1, 1}), 4),
                       "declares 3 tokens but its shard holds 4"));
  EXPECT_TRUE(
      contains(read_error(raw_flags(20240520, 1, 3, {1, 1, 1}), 3), "is not a token flags file"));
  EXPECT_TRUE(contains(read_error(raw_flags(20261205, 2, 3, {1, 1, 1}), 3), "has version 2"));
  EXPECT_TRUE(contains(read_error(raw_flags(20261205, 1, 3, {1, 1}), 3), "holds 2 flag bytes"));
  EXPECT_TRUE(
      contains(read_error(raw_flags(20261205, 1, 3, {1, 4, 1}), 3), "the byte 4 for token 1"));
  EXPECT_TRUE(contains(read_error("short", 3), "fewer than the 1024-byte header"));
  EXPECT_TRUE(contains(error_message([&] { read_token_flags(dir.file("missing.flags"), 1); }),
                       "cannot open token flags"));
  EXPECT_TRUE(contains(error_message([&] { write_token_flags(path, std::vector<uint8_t>{8}); }),
                       "bits other than"));
  EXPECT_TRUE(contains(error_message([&] { write_token_flags(path, {}); }), "no tokens"));
}

}  // namespace
}  // namespace layup
