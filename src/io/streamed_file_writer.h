// Writes a large file through two buffers: the caller fills one while a thread of its own writes
// the other, with direct I/O where the file system takes it.
//
// For checkpoints of tens of GB: producing the bytes (copying state out of the GPU, the host or
// the disk tier) overlaps writing them, and direct I/O keeps them out of the page cache, which on
// a host the run already fills would be reclaimed page by page while the writer waits.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

namespace layup {

// Each of the writer's two buffers; a multiple of the 4 KiB direct I/O needs.
inline constexpr size_t kStreamedWriteBufferBytes = size_t{32} << 20;

// Throws the layup::Error of a failed write to `temp_path` (the new contents of `path`): `result`
// is what write or pwrite returned (0: nothing accepted), `error` its errno.
[[noreturn]] void fail_file_write(const std::string& temp_path, const std::string& path,
                                  ssize_t result, int error, size_t written_bytes,
                                  size_t bytes_left);

class StreamedFileWriter {
 public:
  // `fd` is open for writing at offset 0 and stays the caller's; `temp_path` and `path` name the
  // file in errors. With `direct_io` the writer asks for O_DIRECT and falls back to buffered
  // writes where the file system refuses it.
  StreamedFileWriter(int fd, std::string temp_path, std::string path, bool direct_io = true,
                     size_t buffer_bytes = kStreamedWriteBufferBytes);
  // Stops the thread after the write in flight; bytes not finish()ed are not written.
  ~StreamedFileWriter();
  StreamedFileWriter(const StreamedFileWriter&) = delete;
  StreamedFileWriter& operator=(const StreamedFileWriter&) = delete;

  // Copies `bytes` into the buffer being filled, handing it to the thread each time it is full.
  // Throws the error of an earlier write, if one failed.
  void append(std::span<const std::byte> bytes);
  // Writes what is left, waits for the thread and gives the file its exact length.
  void finish();

  size_t bytes_appended() const { return file_offset_ + filled_; }
  // "direct I/O (O_DIRECT)" or why the writes went through the page cache.
  std::string io_mode() const;

 private:
  struct FreeAligned {
    void operator()(std::byte* bytes) const;
  };
  using Buffer = std::unique_ptr<std::byte[], FreeAligned>;

  void hand_over(size_t bytes, size_t write_bytes);
  void wait_until_idle();  // and rethrows the thread's error
  void run();
  void write_at(const std::byte* data, size_t bytes, size_t offset);

  const int fd_;
  const std::string temp_path_, path_;
  const size_t buffer_bytes_;
  Buffer buffers_[2];
  int filling_ = 0;         // the buffer append() copies into
  size_t filled_ = 0;       // its bytes so far
  size_t file_offset_ = 0;  // where the buffer being filled goes in the file
  bool direct_io_ = false;  // O_DIRECT is on: the thread writes whole 4 KiB blocks
  std::string fallback_why_;

  // Shared with the thread, under mutex_.
  std::mutex mutex_;
  std::condition_variable changed_;
  const std::byte* job_data_ = nullptr;  // the buffer to write, null when idle
  size_t job_bytes_ = 0, job_offset_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace layup
