// Two buffers and a writer thread; O_DIRECT where the file system takes it.
#include "io/streamed_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace layup {
namespace {

constexpr size_t kDirectAlignment = 4096;
// Linux writes at most about 2 GiB per call; stay below that.
constexpr size_t kMaxWriteBytes = size_t{1} << 30;

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

}  // namespace

void fail_file_write(const std::string& temp_path, const std::string& path, ssize_t result,
                     int error, size_t written_bytes, size_t bytes_left) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  // EFBIG is the process's file size limit, not the disk: more free space would not help.
  const std::string check =
      result < 0 && error == EFBIG
          ? std::string(
                "the file is larger than this process may write (ulimit -f); raise the "
                "limit with `ulimit -f unlimited`")
          : "check the free disk space in " + (dir.empty() ? std::string(".") : dir.string());
  fail("cannot write ", temp_path, " (the new contents of ", path,
       "): ", result == 0 ? "the file system accepted no more bytes" : std::strerror(error),
       " after ", written_bytes, " bytes, with ", bytes_left, " bytes of this write left; ", check,
       "; ", path, " was left unchanged");
}

void StreamedFileWriter::FreeAligned::operator()(std::byte* bytes) const {
  std::free(bytes);
}

StreamedFileWriter::StreamedFileWriter(int fd, std::string temp_path, std::string path,
                                       bool direct_io, size_t buffer_bytes)
    : fd_(fd),
      temp_path_(std::move(temp_path)),
      path_(std::move(path)),
      buffer_bytes_(round_up(std::max<size_t>(buffer_bytes, 1), kDirectAlignment)) {
  for (Buffer& buffer : buffers_) {
    buffer.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectAlignment, buffer_bytes_)));
    LAYUP_CHECK(buffer != nullptr, "cannot allocate ", buffer_bytes_, " bytes to write ", path_,
                " through");
  }
  if (!direct_io) {
    fallback_why_ = "asked for";
  } else if (const int flags = ::fcntl(fd_, F_GETFL);
             flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0) {
    direct_io_ = true;
  } else {
    fallback_why_ = "the file system does not support O_DIRECT";
  }
  thread_ = std::thread([this] { run(); });
}

StreamedFileWriter::~StreamedFileWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StreamedFileWriter::append(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const size_t piece = std::min(bytes.size(), buffer_bytes_ - filled_);
    std::memcpy(buffers_[filling_].get() + filled_, bytes.data(), piece);
    filled_ += piece;
    bytes = bytes.subspan(piece);
    if (filled_ == buffer_bytes_) hand_over(filled_, filled_);
  }
}

void StreamedFileWriter::finish() {
  const size_t length = bytes_appended();
  if (filled_ > 0) {
    // Direct I/O writes whole blocks: the tail goes out padded with zeros, and the file is cut
    // back to its length below. (Buffered writes take the padding as well, for one code path.)
    const size_t padded = round_up(filled_, kDirectAlignment);
    std::memset(buffers_[filling_].get() + filled_, 0, padded - filled_);
    hand_over(filled_, padded);
  }
  wait_until_idle();
  if (::ftruncate(fd_, static_cast<off_t>(length)) != 0)
    fail("cannot set the length of ", temp_path_, " (the new contents of ", path_, ") to its ",
         length, " bytes: ", std::strerror(errno), "; ", path_, " was left unchanged");
}

std::string StreamedFileWriter::io_mode() const {
  return direct_io_ ? "direct I/O (O_DIRECT)" : "buffered I/O (" + fallback_why_ + ")";
}

void StreamedFileWriter::hand_over(size_t bytes, size_t write_bytes) {
  wait_until_idle();
  {
    std::lock_guard lock(mutex_);
    job_data_ = buffers_[filling_].get();
    job_bytes_ = write_bytes;
    job_offset_ = file_offset_;
  }
  changed_.notify_all();
  file_offset_ += bytes;
  filling_ ^= 1;
  filled_ = 0;
}

void StreamedFileWriter::wait_until_idle() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return job_data_ == nullptr; });
  if (error_) std::rethrow_exception(error_);
}

void StreamedFileWriter::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stop_ || job_data_ != nullptr; });
    if (job_data_ == nullptr) return;  // stopped while idle
    const std::byte* data = job_data_;
    const size_t bytes = job_bytes_, offset = job_offset_;
    lock.unlock();
    std::exception_ptr error;
    // After a failed write the file is abandoned: later jobs are skipped, not written.
    if (!error_) try {
        write_at(data, bytes, offset);
      } catch (...) {
        error = std::current_exception();
      }
    lock.lock();
    if (error) error_ = error;
    job_data_ = nullptr;
    changed_.notify_all();
  }
}

void StreamedFileWriter::write_at(const std::byte* data, size_t bytes, size_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const size_t ask = std::min(bytes - done, kMaxWriteBytes);
    const ssize_t written = ::pwrite(fd_, data + done, ask, static_cast<off_t>(offset + done));
    if (written < 0 && errno == EINTR) continue;
    // Some file systems take O_DIRECT at fcntl and refuse it at the first request (EINVAL):
    // buffered from here on, the same bytes again.
    if (written < 0 && errno == EINVAL && direct_io_) {
      const int flags = ::fcntl(fd_, F_GETFL);
      if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
        direct_io_ = false;
        fallback_why_ = "the file system refuses O_DIRECT requests";
        continue;
      }
    }
    // A full disk shows as a short write followed by ENOSPC (or EFBIG past a file size limit);
    // a write of 0 bytes would otherwise loop for ever.
    if (written <= 0)
      fail_file_write(temp_path_, path_, written, errno, offset + done, bytes - done);
    done += static_cast<size_t>(written);
  }
}

}  // namespace layup
