// Reading and writing llm.c-style token shards, uint16 and uint32.
#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; layup reads and writes them without byte swaps");

namespace {

// Reads exactly out.size() bytes at `offset`, or fails.
void read_exactly(int fd, size_t offset, std::span<std::byte> out, const std::string& path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t got =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    LAYUP_CHECK(got > 0, "cannot read token shard ", path, ": ",
                got == 0 ? "the file ended early (was it changed while being read?)"
                         : std::strerror(errno));
    done += static_cast<size_t>(got);
  }
}

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

template <class TokenId>
void write_shard(const std::string& path, int32_t magic, int32_t version,
                 std::span<const TokenId> tokens) {
  LAYUP_CHECK(!tokens.empty(), "cannot write token shard ", path,
              ": there are no tokens to write (a shard holds at least one)");
  LAYUP_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
              "cannot write token shard ", path, ": ", tokens.size(),
              " tokens do not fit one shard (at most 2147483647); split them over several");
  std::array<int32_t, kTokenShardHeaderInts> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(header)),
                                               std::as_bytes(tokens)};
  write_file_atomically(path, pieces);
}

// Refuses the first of `ids` (the shard's ids from position `first`) that is not below
// vocab_size. The largest id is found first, by a loop without branches that the compiler
// vectorizes: the check then costs a fraction of reading the file.
template <class Id>
void check_ids(std::span<const Id> ids, size_t first, const std::string& path, int64_t vocab_size) {
  Id largest = 0;
  for (const Id id : ids) largest = std::max(largest, id);
  if (largest < vocab_size) return;
  const size_t position = static_cast<size_t>(
      std::find_if(ids.begin(), ids.end(), [&](Id id) { return id >= vocab_size; }) - ids.begin());
  fail("token shard ", path, " has token id ", ids[position], " at position ", first + position,
       ", outside the vocabulary of ", vocab_size,
       " tokens; the shard was made with another tokenizer (make it again with `layup tokenize "
       "--tokenizer` and the model's own) or is damaged");
}

// Reads the `out.size()` ids of the shard's body, stored as FileId, into `out`, checking each
// against the vocabulary.
template <class FileId, class TokenId>
void read_ids(int fd, const std::string& path, int64_t vocab_size, std::vector<TokenId>& out) {
  if constexpr (sizeof(FileId) == sizeof(TokenId)) {
    read_exactly(fd, kTokenShardHeaderBytes, std::as_writable_bytes(std::span(out)), path);
    check_ids(std::span<const TokenId>(out), 0, path, vocab_size);
  } else {
    // Through a buffer of the file's width, a chunk at a time.
    std::vector<FileId> chunk(std::min<size_t>(out.size(), size_t{1} << 20));
    for (size_t done = 0; done < out.size(); done += chunk.size()) {
      chunk.resize(std::min(chunk.size(), out.size() - done));
      read_exactly(fd, kTokenShardHeaderBytes + done * sizeof(FileId),
                   std::as_writable_bytes(std::span(chunk)), path);
      check_ids(std::span<const FileId>(chunk), done, path, vocab_size);
      // Fits: below vocab_size.
      std::transform(chunk.begin(), chunk.end(), out.begin() + static_cast<std::ptrdiff_t>(done),
                     [](FileId id) { return static_cast<TokenId>(id); });
    }
  }
}

template <class TokenId>
std::vector<TokenId> read_shard(const std::string& path, int64_t vocab_size) {
  constexpr int64_t kMaxVocab = int64_t{std::numeric_limits<TokenId>::max()} + 1;
  LAYUP_CHECK(vocab_size >= 1 && vocab_size <= kMaxVocab, "cannot check token shard ", path,
              " against a vocabulary of ", vocab_size, " tokens (expected 1..", kMaxVocab, ")");
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  LAYUP_CHECK(fd.get() >= 0, "cannot open token shard ", path, ": ", std::strerror(errno));
  struct stat info;
  LAYUP_CHECK(::fstat(fd.get(), &info) == 0 && S_ISREG(info.st_mode), "cannot read token shard ",
              path, ": it is not a regular file");
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  LAYUP_CHECK(file_bytes > 0, "token shard ", path,
              " is empty (0 bytes); it was not written completely, make it again");
  LAYUP_CHECK(file_bytes >= kTokenShardHeaderBytes, "token shard ", path, " has ", file_bytes,
              " bytes, fewer than the ", kTokenShardHeaderBytes,
              "-byte header of a layup/llm.c token shard; the file is truncated or is not a "
              "token shard");

  std::array<int32_t, kTokenShardHeaderInts> header{};
  read_exactly(fd.get(), 0, std::as_writable_bytes(std::span(header)), path);
  const bool wide = header[0] == kWideTokenShardMagic;
  LAYUP_CHECK(header[0] == kTokenShardMagic || wide, path,
              " is not a layup/llm.c token shard: it starts with the number ", header[0],
              " where a shard has the magic number ", kTokenShardMagic, " (uint16 ids) or ",
              kWideTokenShardMagic,
              " (uint32 ids); token shards are made by `layup tokenize` or llm.c's data scripts");
  const int32_t expected_version = wide ? kWideTokenShardVersion : kTokenShardVersion;
  LAYUP_CHECK(header[1] == expected_version, "token shard ", path, " has version ", header[1],
              "; layup reads version ", expected_version, " under the magic number ", header[0],
              " (llm.c's layouts: version ", kTokenShardVersion, " of ", kTokenShardMagic,
              " holds uint16 ids, version ", kWideTokenShardVersion, " of ", kWideTokenShardMagic,
              " uint32 ids)");
  const int64_t declared = header[2];
  LAYUP_CHECK(declared > 0, "token shard ", path, " declares ", declared,
              " tokens in its header; a shard holds at least one");

  const size_t id_bytes = wide ? sizeof(uint32_t) : sizeof(uint16_t);
  const size_t body_bytes = file_bytes - kTokenShardHeaderBytes;
  const size_t expected_bytes = static_cast<size_t>(declared) * id_bytes;
  LAYUP_CHECK(body_bytes >= expected_bytes, "token shard ", path,
              " is truncated: its header declares ", declared, " tokens but the file holds only ",
              body_bytes / id_bytes, " (", body_bytes, " bytes after the header, ", id_bytes,
              " per token); make the shard again");
  LAYUP_CHECK(body_bytes == expected_bytes, "token shard ", path, " has ",
              body_bytes - expected_bytes, " bytes after the ", declared,
              " tokens its header declares; the header's count is wrong or the file is damaged");

  std::vector<TokenId> tokens(static_cast<size_t>(declared));
  if (wide) {
    read_ids<uint32_t>(fd.get(), path, vocab_size, tokens);
  } else {
    read_ids<uint16_t>(fd.get(), path, vocab_size, tokens);
  }
  return tokens;
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  write_shard(path, kTokenShardMagic, kTokenShardVersion, tokens);
}

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens) {
  write_shard(path, kWideTokenShardMagic, kWideTokenShardVersion, tokens);
}

std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size) {
  return read_shard<uint16_t>(path, vocab_size);
}

std::vector<uint32_t> read_token_shard_as_uint32(const std::string& path, int64_t vocab_size) {
  return read_shard<uint32_t>(path, vocab_size);
}

}  // namespace layup
