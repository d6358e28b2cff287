// Atomic file writes: temporary file, fsync, rename over the target, fsync of the directory.
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/streamed_file_writer.h"

namespace layup {
namespace {

std::string parent_dir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// Collects small appends into one buffer so a writer that emits a header field by field does not
// turn into thousands of system calls; appends at least as large as the buffer bypass it.
class BufferedFileWriter {
 public:
  BufferedFileWriter(int fd, const std::string& temp_path, const std::string& path)
      : fd_(fd), temp_path_(temp_path), path_(path) {
    buffer_.reserve(kBufferBytes);
  }

  void append(std::span<const std::byte> bytes) {
    if (buffer_.size() + bytes.size() > kBufferBytes) flush();
    if (bytes.size() >= kBufferBytes) {
      write_all(bytes);
    } else {
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
  }

  void flush() {
    write_all(buffer_);
    buffer_.clear();
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  // Linux writes at most about 2 GiB per call; stay below that.
  static constexpr size_t kMaxWriteBytes = size_t{1} << 30;

  void write_all(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      ssize_t written = ::write(fd_, bytes.data(), std::min(bytes.size(), kMaxWriteBytes));
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0)
        fail_file_write(temp_path_, path_, written, errno, written_bytes_, bytes.size());
      bytes = bytes.subspan(static_cast<size_t>(written));
      written_bytes_ += static_cast<size_t>(written);
    }
  }

  int fd_;
  const std::string& temp_path_;
  const std::string& path_;
  std::vector<std::byte> buffer_;
  size_t written_bytes_ = 0;
};

std::string temp_path_for(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

// Writes `temp_path` completely and flushes it to disk; on any failure removes it and rethrows.
void write_temporary(const std::string& temp_path, const std::string& path,
                     const std::function<void(const AppendBytes& append)>& write_contents,
                     FileWriteMode mode) {
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fail("cannot create ", temp_path, " to write ", path, ": ", std::strerror(errno),
         "; check that the directory ", parent_dir(path), " exists and is writable");
  }
  try {
    if (mode == FileWriteMode::kStreamed) {
      StreamedFileWriter writer(fd, temp_path, path);
      write_contents([&writer](std::span<const std::byte> bytes) { writer.append(bytes); });
      writer.finish();
    } else {
      BufferedFileWriter writer(fd, temp_path, path);
      write_contents([&writer](std::span<const std::byte> bytes) { writer.append(bytes); });
      writer.flush();
    }
    // The data must be on disk before the rename makes it visible under the real name;
    // otherwise a crash could leave a complete-looking name over incomplete data.
    if (::fsync(fd) != 0) {
      fail("cannot flush ", temp_path, " to disk: ", std::strerror(errno), "; ", path,
           " was left unchanged");
    }
    int close_result = ::close(fd);
    fd = -1;
    if (close_result != 0) {
      fail("cannot close ", temp_path, ": ", std::strerror(errno), "; ", path,
           " was left unchanged");
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(temp_path.c_str());
    throw;
  }
}

void rename_over(const std::string& temp_path, const std::string& path) {
  if (::rename(temp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp_path.c_str());
    fail("cannot rename ", temp_path, " to ", path, ": ", std::strerror(error), "; ", path,
         " was left unchanged");
  }
}

}  // namespace

void write_file_atomically(const std::string& path,
                           const std::function<void(const AppendBytes& append)>& write_contents,
                           FileWriteMode mode) {
  const std::string temp_path = temp_path_for(path);
  write_temporary(temp_path, path, write_contents, mode);
  rename_over(temp_path, path);
  fsync_directory(parent_dir(path));
}

StagedFiles::~StagedFiles() {
  for (const Staged& file : staged_) ::unlink(file.temp_path.c_str());
}

void StagedFiles::stage(const std::string& path,
                        const std::function<void(const AppendBytes& append)>& write_contents,
                        FileWriteMode mode) {
  const std::string temp_path = temp_path_for(path);
  write_temporary(temp_path, path, write_contents, mode);
  staged_.push_back({temp_path, path});
}

void StagedFiles::commit() {
  std::vector<std::string> dirs;
  while (!staged_.empty()) {
    const Staged file = staged_.front();
    staged_.erase(staged_.begin());
    rename_over(file.temp_path, file.path);
    const std::string dir = parent_dir(file.path);
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  }
  for (const std::string& dir : dirs) fsync_directory(dir);
}

void write_file_atomically(const std::string& path, std::span<const std::byte> contents) {
  write_file_atomically(path, [contents](const AppendBytes& append) { append(contents); });
}

void write_file_atomically(const std::string& path,
                           std::span<const std::span<const std::byte>> pieces) {
  write_file_atomically(path, [pieces](const AppendBytes& append) {
    for (std::span<const std::byte> piece : pieces) append(piece);
  });
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory ", dir, " to flush it to disk: ", std::strerror(errno));
  int result = ::fsync(fd);
  int error = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are durable anyway.
  if (result != 0 && error != EINVAL) {
    fail("cannot flush directory ", dir, " to disk: ", std::strerror(error));
  }
}

void write_text_atomically(const std::string& path, std::string_view text) {
  write_file_atomically(path, std::as_bytes(std::span(text.data(), text.size())));
}

std::vector<std::byte> read_file_bytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("cannot read ", path, ": it is not a regular file");
  }
  std::vector<std::byte> bytes(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int error = errno;
      ::close(fd);
      fail("cannot read ", path, ": ",
           got == 0 ? "the file shrank while being read" : std::strerror(error));
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return bytes;
}

}  // namespace layup
