// The decoder of a tokenizer.json: how the tokens of ids become text again. It starts from each
// id's token (an added token's content, else the model's token) and runs tokenizers' steps on the
// list of them, then joins what is left:
//   ByteLevel     (byte-level models, alone) the tokens' bytes, which layup already holds, so
//                 invalid UTF-8 stays as it is;
//   Replace       in each token, every occurrence of a String pattern becomes `content`;
//   ByteFallback  runs of <0xNN> tokens become their bytes: one piece of text if those are valid
//                 UTF-8, else U+FFFD for each byte;
//   Fuse          all tokens become one;
//   Strip         each token loses up to `start` leading and `stop` trailing `content` characters;
//   Metaspace     in each token the replacement ("▁") becomes a space, except in the first token,
//                 where every replacement is dropped unless prepend_scheme is "never";
//   Sequence      its `decoders` in order.
// Llama 2's and Mistral's: Sequence [Replace "▁" -> " ", ByteFallback, Fuse, Strip " " start 1].
// With no decoder, a byte-level model's tokens are joined as they are; any other model's are
// joined with a space between them, as tokenizers does.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tokenizer/hf_pre_tokenizer.h"

namespace layup {

class HfDecoder {
 public:
  // Reads the value of the "decoder" field (nullptr when null or absent); `byte_level` says
  // whether the model spells its tokens in the byte alphabet, which only ByteLevel decodes.
  static HfDecoder read(const nlohmann::json* decoder, bool byte_level, const std::string& source);

  std::string decode(std::vector<std::string> tokens) const;

 private:
  struct Step {
    enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
    Kind kind = Kind::kFuse;
    std::string pattern, content;  // kReplace; kStrip's content
    size_t strip_start = 0, strip_stop = 0;
    MetaspaceOptions metaspace;
  };
  void read_step(const nlohmann::json& value, const std::string& path, const std::string& source);

  std::vector<Step> steps_;
  std::string separator_;  // what joins the tokens in the end
};

}  // namespace layup
