// Per-token flags beside a token shard: which targets the loss learns, and where examples begin.
//
//   NAME.bin    the token shard (data/token_shard.h)
//   NAME.flags  header: 256 little-endian int32: [0] magic 20261205, [1] version 1,
//                       [2] token count (the shard's), the rest 0
//               body:   one byte per token of the shard:
//                         bit 0 kTokenLearn: predicting this token counts in the loss
//                         bit 1 kTokenExampleStart: this token begins an example (packing keeps
//                               examples whole and apart)
//                       the other bits 0
//
// A shard without a flags file is plain text: every token learned, the shard one example. The
// reader checks every field and byte, so a flags file that does not belong to its shard stops the
// run at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace layup {

inline constexpr uint8_t kTokenLearn = 1;
inline constexpr uint8_t kTokenExampleStart = 2;
inline constexpr int32_t kTokenFlagsMagic = 20261205;
inline constexpr int32_t kTokenFlagsVersion = 1;

// The flags file of a shard: NAME.bin -> NAME.flags (any other name gets ".flags" appended).
std::string token_flags_path(const std::string& shard_path);

// Writes `flags` (at least one, at most 2^31 - 1, only the bits above) to `path`, atomically.
void write_token_flags(const std::string& path, std::span<const uint8_t> flags);

// Reads the flags file at `path` and checks it against its shard's `token_count`: the header, the
// file's length and that no byte has a bit other than kTokenLearn and kTokenExampleStart. Throws
// layup::Error naming the file and the problem.
std::vector<uint8_t> read_token_flags(const std::string& path, size_t token_count);

}  // namespace layup
