// Reading and writing the per-token flags files beside token shards.
#include "data/token_flags.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "data/token_shard.h"
#include "io/atomic_file.h"

namespace layup {

static_assert(std::endian::native == std::endian::little,
              "flags headers are little-endian; layup reads and writes them without byte swaps");

namespace {

constexpr uint8_t kKnownFlags = kTokenLearn | kTokenExampleStart;

}  // namespace

std::string token_flags_path(const std::string& shard_path) {
  const std::string_view bin = ".bin";
  if (shard_path.size() > bin.size() && shard_path.ends_with(bin))
    return shard_path.substr(0, shard_path.size() - bin.size()) + ".flags";
  return shard_path + ".flags";
}

void write_token_flags(const std::string& path, std::span<const uint8_t> flags) {
  LAYUP_CHECK(!flags.empty(), "cannot write token flags ", path,
              ": there are no tokens (a shard holds at least one)");
  LAYUP_CHECK(flags.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
              "cannot write token flags ", path, ": ", flags.size(),
              " tokens do not fit one shard (at most 2147483647)");
  const auto unknown = std::find_if(flags.begin(), flags.end(),
                                    [](uint8_t flag) { return (flag & ~kKnownFlags) != 0; });
  LAYUP_CHECK(unknown == flags.end(), "cannot write token flags ", path, ": token ",
              unknown - flags.begin(), " has flags ", int{*unknown},
              ", which holds bits other than learn (1) and example start (2)");
  std::array<int32_t, kTokenShardHeaderInts> header{};
  header[0] = kTokenFlagsMagic;
  header[1] = kTokenFlagsVersion;
  header[2] = static_cast<int32_t>(flags.size());
  const std::span<const std::byte> pieces[] = {std::as_bytes(std::span(header)),
                                               std::as_bytes(flags)};
  write_file_atomically(path, pieces);
}

std::vector<uint8_t> read_token_flags(const std::string& path, size_t token_count) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  LAYUP_CHECK(in, "cannot open token flags ", path, ": ", std::strerror(errno));
  const std::streamoff file_bytes = in.tellg();
  LAYUP_CHECK(file_bytes >= static_cast<std::streamoff>(kTokenShardHeaderBytes), "token flags ",
              path, " has ", file_bytes, " bytes, fewer than the ", kTokenShardHeaderBytes,
              "-byte header; it is truncated or not a flags file (make the shards again with "
              "`layup tokenize`)");
  std::array<int32_t, kTokenShardHeaderInts> header{};
  in.seekg(0);
  in.read(reinterpret_cast<char*>(header.data()), kTokenShardHeaderBytes);
  LAYUP_CHECK(in, "cannot read token flags ", path, ": ", std::strerror(errno));
  LAYUP_CHECK(header[0] == kTokenFlagsMagic, path,
              " is not a token flags file: it starts with the number ", header[0],
              " where a flags file has the magic number ", kTokenFlagsMagic);
  LAYUP_CHECK(header[1] == kTokenFlagsVersion, "token flags ", path, " has version ", header[1],
              "; layup reads version ", kTokenFlagsVersion);
  LAYUP_CHECK(header[2] >= 0 && static_cast<size_t>(header[2]) == token_count, "token flags ", path,
              " declares ", header[2], " tokens but its shard holds ", token_count,
              "; the two files were not made together (make the shards again with `layup "
              "tokenize`)");
  const size_t body_bytes = static_cast<size_t>(file_bytes) - kTokenShardHeaderBytes;
  LAYUP_CHECK(body_bytes == token_count, "token flags ", path, " holds ", body_bytes,
              " flag bytes after its header where it declares ", token_count,
              "; the file is truncated or damaged (make the shards again with `layup tokenize`)");
  std::vector<uint8_t> flags(token_count);
  in.read(reinterpret_cast<char*>(flags.data()), static_cast<std::streamsize>(token_count));
  LAYUP_CHECK(in, "cannot read token flags ", path, ": ", std::strerror(errno));
  const auto unknown = std::find_if(flags.begin(), flags.end(),
                                    [](uint8_t flag) { return (flag & ~kKnownFlags) != 0; });
  LAYUP_CHECK(unknown == flags.end(), "token flags ", path, " has the byte ", int{*unknown},
              " for token ", unknown - flags.begin(),
              ", with bits other than learn (1) and example start (2); the file is damaged");
  return flags;
}

}  // namespace layup
