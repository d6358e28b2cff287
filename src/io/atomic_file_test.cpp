// Tests of the atomic write protocol: complete new contents or the old file, never a mix.
#include "io/atomic_file.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span(text));
}

TEST(AtomicFile, WritesAndReplacesWithoutLeavingTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.file("data.bin");
  write_file_atomically(path, bytes_of("first version, rather long"));
  EXPECT_EQ(read_text(path), "first version, rather long");
  write_file_atomically(path, bytes_of("second"));
  EXPECT_EQ(read_text(path), "second");
  EXPECT_EQ(snapshot(dir.path()).size(), 1u);  // no data.bin.tmp-<pid> left
}

TEST(AtomicFile, ConcatenatesPiecesAndStreamedAppends) {
  TempDir dir;
  const std::string a = "head|", b(3 << 20, 'x'), c = "|tail";  // b bypasses the 1 MiB buffer
  const std::span<const std::byte> pieces[] = {bytes_of(a), bytes_of(b), bytes_of(c)};
  write_file_atomically(dir.file("pieces"), pieces);
  EXPECT_EQ(read_text(dir.file("pieces")), a + b + c);

  write_file_atomically(dir.file("streamed"), [&](const AppendBytes& append) {
    for (int i = 0; i < 1000; ++i) append(bytes_of(std::to_string(i)));
    append(bytes_of(b));
  });
  std::string expected;
  for (int i = 0; i < 1000; ++i) expected += std::to_string(i);
  EXPECT_EQ(read_text(dir.file("streamed")), expected + b);
}

TEST(AtomicFile, ExceptionFromWriterKeepsOldFileAndRemovesTemporary) {
  TempDir dir;
  const std::string path = dir.file("state.bin");
  write_text(path, "old contents");
  const auto before = snapshot(dir.path());
  EXPECT_THROW(write_file_atomically(path,
                                     [&](const AppendBytes& append) {
                                       append(bytes_of(std::string(2 << 20, 'n')));
                                       throw std::runtime_error("writer failed half-way");
                                     }),
               std::runtime_error);
  EXPECT_EQ(snapshot(dir.path()), before);
}

TEST(AtomicFile, ExceptionFromWriterCreatesNothing) {
  TempDir dir;
  EXPECT_THROW(write_file_atomically(dir.file("new.bin"),
                                     [](const AppendBytes& append) {
                                       append(bytes_of("partial"));
                                       throw Error("stop");
                                     }),
               Error);
  EXPECT_TRUE(snapshot(dir.path()).empty());
}

TEST(AtomicFile, MissingDirectoryIsAnError) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/file.bin");
  const std::string message = error_message([&] { write_file_atomically(path, bytes_of("x")); });
  EXPECT_TRUE(contains(message, path));
  EXPECT_TRUE(contains(message, "exists and is writable"));
  EXPECT_TRUE(snapshot(dir.path()).empty());
}

TEST(AtomicFile, ReadFileBytes) {
  TempDir dir;
  write_text(dir.file("f"), std::string("a\0b", 3));
  const std::vector<std::byte> bytes = read_file_bytes(dir.file("f"));
  ASSERT_EQ(bytes.size(), 3u);
  EXPECT_EQ(bytes[1], std::byte{0});
  EXPECT_TRUE(
      contains(error_message([&] { read_file_bytes(dir.file("missing")); }), "No such file"));
}

}  // namespace
}  // namespace layup
