// Writing files so that a crash or an error never leaves a half-written one behind.
//
// Every file layup writes (weights, optimizer state, token shards) goes through here: the bytes go
// to `<path>.tmp-<pid>` in the same directory, which is flushed to disk (fsync) and then renamed
// over `<path>`; finally the directory itself is flushed so the rename survives a power cut.
// rename() within one directory is atomic on POSIX file systems, so a reader sees either the old
// file or the complete new one. If anything fails before the rename, the temporary file is
// removed, the old file is untouched, and a layup::Error says what went wrong.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

// Appends bytes to the file being written. Small pieces are buffered, large ones go straight
// to the file, so a writer may hand over anything from one header field to a whole tensor.
using AppendBytes = std::function<void(std::span<const std::byte>)>;

// How a file's bytes reach the disk before its flush.
enum class FileWriteMode {
  kBuffered,  // through the page cache: small files and anything written piece by piece
  kStreamed,  // large files (checkpoint shards): StreamedFileWriter's thread and direct I/O
};

// Writes `contents` to `path` atomically.
void write_file_atomically(const std::string& path, std::span<const std::byte> contents);

// The same for text (JSON, SVG, markdown): its bytes as they are.
void write_text_atomically(const std::string& path, std::string_view text);

// Writes the concatenation of `pieces` to `path` atomically, without concatenating them in memory.
void write_file_atomically(const std::string& path,
                           std::span<const std::span<const std::byte>> pieces);

// Calls `write_contents` with an AppendBytes that streams into the temporary file, then commits
// the file. An exception thrown by `write_contents` removes the temporary file and propagates;
// the old file at `path` is left as it was.
void write_file_atomically(const std::string& path,
                           const std::function<void(const AppendBytes& append)>& write_contents,
                           FileWriteMode mode = FileWriteMode::kBuffered);

// Several files that appear together, e.g. the shards of a checkpoint and their index. Each file is
// written and flushed under `<path>.tmp-<pid>`; nothing appears under a final name until commit(),
// which renames them all in the order they were staged (so stage an index last). A failure while
// staging, or destruction without commit(), removes every temporary and leaves the old files as
// they were. Renames are not one atomic step: a crash during commit() (a few renames in one
// directory) can leave some new files beside old ones; a run's checkpoint directory is published
// by one more rename on top (checkpoint.h) for that. Until commit(), the old and the new files take
// disk space together.
class StagedFiles {
 public:
  StagedFiles() = default;
  ~StagedFiles();
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;

  // Writes a temporary for `path` as write_file_atomically does, without the rename.
  void stage(const std::string& path,
             const std::function<void(const AppendBytes& append)>& write_contents,
             FileWriteMode mode = FileWriteMode::kBuffered);
  void commit();

 private:
  struct Staged {
    std::string temp_path;
    std::string path;
  };
  std::vector<Staged> staged_;
};

// Flushes a directory's entries (new names, renames, deletions) to disk.
void fsync_directory(const std::string& dir);

// Reads a whole file. Throws layup::Error naming the file when it cannot be opened or read.
std::vector<std::byte> read_file_bytes(const std::string& path);

}  // namespace layup
