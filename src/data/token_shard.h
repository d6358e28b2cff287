// Token shards: the binary files training data is stored in, in llm.c's two layouts.
//
//   header: 256 little-endian int32: [0] magic, [1] version, [2] token count, the rest 0
//   body:   token count little-endian token ids, as wide as the magic and version say:
//             magic 20240520, version 1: uint16 ids (llm.c's GPT-2 layout), vocabularies of up
//                                        to 65,536 tokens
//             magic 20240801, version 7: uint32 ids (llm.c's Llama 3 layout), larger ones
//
// Files made by llm.c's data scripts (fineweb.py, tinyshakespeare.py; model_desc "gpt-2" or
// "llama-3") are read as they are, and layup's own shards can be fed to llm.c. layup writes the
// uint16 layout whenever the vocabulary allows it, so GPT-2 shards are what they always were.
// The reader checks every field and every token id, so a wrong or damaged file stops the run at
// load time with a message instead of training on noise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace layup {

inline constexpr int32_t kTokenShardMagic = 20240520;  // uint16 ids
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int32_t kWideTokenShardMagic = 20240801;  // uint32 ids
inline constexpr int32_t kWideTokenShardVersion = 7;
inline constexpr size_t kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);

// Write `tokens` (at least one, at most 2^31 - 1) as a shard at `path`, atomically: uint16 ids
// in the first layout, uint32 ids in the second.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens);

// Read a shard of either layout and check it: the header, the file length against the declared
// count, and that every token id is below `vocab_size`. Throws layup::Error naming the file and
// the problem. The ids come back as uint16 (vocab_size at most 65,536, so a uint32 shard whose
// ids are all below it reads too) or as uint32.
std::vector<uint16_t> read_token_shard(const std::string& path, int64_t vocab_size);
std::vector<uint32_t> read_token_shard_as_uint32(const std::string& path, int64_t vocab_size);

}  // namespace layup
