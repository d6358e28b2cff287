// Token shards: the binary files training data is stored in, in llm.c's layout.
//
//   header: 256 little-endian int32: [0] magic 20240520, [1] version 1, [2] token count, rest 0
//   body:   token count little-endian uint16 token ids
//
// Files made by llm.c's data scripts (fineweb.py, tinyshakespeare.py) are read as they are, and
// layup's own shards can be fed to llm.c. The reader checks every field and every token id, so a
// wrong or damaged file stops the run at load time with a message instead of training on noise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace layup {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);

// Writes `tokens` (at least one, at most 2^31 - 1) as a shard at `path`, atomically.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

// Reads a shard and checks it: the header, the file length against the declared count, and that
// every token id is below `vocab_size`. Throws layup::Error naming the file and the problem.
std::vector<uint16_t> read_token_shard(const std::string& path, int vocab_size);

}  // namespace layup
