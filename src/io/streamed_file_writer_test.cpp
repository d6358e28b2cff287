// The streamed writer: exact bytes and length at every size around its buffer and the 4 KiB
// blocks of direct I/O, with and without direct I/O; a failed write surfaces as a layup::Error.
#include "io/streamed_file_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/test_files.h"

namespace layup {
namespace {

using test_files::read_text;
using test_files::TempDir;

constexpr size_t kBuffer = 8192;  // two 4 KiB blocks: small, so the sizes below cross it often

// Bytes that differ from their neighbours and from zero, so a misplaced or padded byte shows.
std::string pattern_of(size_t length) {
  std::string bytes(length, '\0');
  for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<char>('a' + (i * 7 + i / 251) % 26);
  return bytes;
}

// Writes `bytes` to a new file in pieces of the sizes given (cycled), returns what is on disk.
std::string write_in_pieces(const TempDir& dir, const std::string& bytes,
                            const std::vector<size_t>& pieces, bool direct_io,
                            std::string* io_mode = nullptr) {
  const std::string path = dir.file("out.bin");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EXPECT_GE(fd, 0);
  {
    StreamedFileWriter writer(fd, path + ".tmp", path, direct_io, kBuffer);
    size_t at = 0;
    for (size_t k = 0; at < bytes.size(); ++k) {
      const size_t piece = std::min(pieces[k % pieces.size()], bytes.size() - at);
      writer.append(std::as_bytes(std::span(bytes.data() + at, piece)));
      at += piece;
    }
    EXPECT_EQ(writer.bytes_appended(), bytes.size());
    writer.finish();
    if (io_mode) *io_mode = writer.io_mode();
  }
  ::close(fd);
  return read_text(path);
}

class StreamedFileWriterSizes : public ::testing::TestWithParam<bool> {};

TEST_P(StreamedFileWriterSizes, WritesExactlyTheBytesAppendedAtEverySize) {
  const bool direct_io = GetParam();
  TempDir dir;
  for (size_t length : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, kBuffer - 1,
                        kBuffer, kBuffer + 1, 2 * kBuffer, 5 * kBuffer + 123}) {
    const std::string bytes = pattern_of(length);
    // Pieces smaller than a block, straddling the buffer, and larger than both buffers together.
    for (const std::vector<size_t>& pieces :
         {std::vector<size_t>{1, 100, 3000}, std::vector<size_t>{kBuffer + 5},
          std::vector<size_t>{3 * kBuffer}}) {
      const std::string written = write_in_pieces(dir, bytes, pieces, direct_io);
      ASSERT_EQ(written.size(), length) << "length " << length << ", direct " << direct_io;
      EXPECT_EQ(written, bytes) << "length " << length << ", direct " << direct_io;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, StreamedFileWriterSizes, ::testing::Bool());

TEST(StreamedFileWriter, SaysHowItWrote) {
  TempDir dir;
  std::string mode;
  write_in_pieces(dir, pattern_of(10000), {4096}, false, &mode);
  EXPECT_EQ(mode, "buffered I/O (asked for)");
  write_in_pieces(dir, pattern_of(10000), {4096}, true, &mode);
  // Which one depends on the file system of the temp dir; both are named.
  EXPECT_TRUE(mode == "direct I/O (O_DIRECT)" || mode.starts_with("buffered I/O (the file system"))
      << mode;
}

// A full disk, as the kernel makes one past RLIMIT_FSIZE: the thread's failed write is thrown by
// the caller's next append or by finish, with the file, the error and the advice.
TEST(StreamedFileWriter, AFailedWriteIsThrownToTheCaller) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &original), 0);
  rlimit small = original;
  small.rlim_cur = 3 * kBuffer;
  const auto previous_handler = ::signal(SIGXFSZ, SIG_IGN);  // fail the write, not the process
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    StreamedFileWriter writer(fd, path + ".tmp-1", path, true, kBuffer);
    const std::string bytes = pattern_of(10 * kBuffer);
    writer.append(std::as_bytes(std::span(bytes)));
    writer.finish();
  } catch (const Error& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &original);
  ::signal(SIGXFSZ, previous_handler);
  ::close(fd);
  EXPECT_NE(message.find("cannot write " + path + ".tmp-1 (the new contents of " + path + ")"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_NE(message.find("ulimit -f unlimited"), std::string::npos) << message;
}

// The caller's own failure: the writer is destroyed with a write in flight and bytes unflushed,
// and neither hangs nor writes past what it was handed.
TEST(StreamedFileWriter, DestroyedWithoutFinishStopsCleanly) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  {
    StreamedFileWriter writer(fd, path + ".tmp", path, true, kBuffer);
    const std::string bytes = pattern_of(2 * kBuffer + 100);
    writer.append(std::as_bytes(std::span(bytes)));
  }
  ::close(fd);
  EXPECT_LE(read_text(path).size(), 2 * kBuffer);
}

}  // namespace
}  // namespace layup
