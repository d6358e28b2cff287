// Reading and running a tokenizer.json pre-tokenizer; see hf_pre_tokenizer.h.
#include "tokenizer/hf_pre_tokenizer.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/hf_normalizer.h"
#include "tokenizer/tokenizer_json_fields.h"
#include "tokenizer/unicode_classes.h"
#include "tokenizer/utf8.h"

namespace layup {
namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenization pattern, which tokenizers' ByteLevel pre-tokenizer runs when its
// use_regex is on.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool is_numeric_at(std::string_view text, size_t position, int& byte_count) {
  const Utf8CodePoint decoded = decode_utf8_at(text, position);
  byte_count = decoded.byte_count;
  return decoded.valid && classify_code_point(decoded.code_point) == CharClass::kNumber;
}

// Digits: numbers apart from the rest; each number alone, or each run of them.
void split_digits(std::string_view piece, bool individual, std::vector<std::string_view>& out) {
  size_t start = 0;
  bool numeric_run = false;
  for (size_t position = 0; position < piece.size();) {
    int byte_count = 1;
    const bool numeric = is_numeric_at(piece, position, byte_count);
    const bool cut = position > start && (numeric != numeric_run || (numeric && individual));
    if (cut) {
      out.push_back(piece.substr(start, position - start));
      start = position;
    }
    numeric_run = numeric;
    position += byte_count;
  }
  out.push_back(piece.substr(start));
}

// Metaspace on one piece.
void split_metaspace(std::string_view piece, bool at_input_start, const MetaspaceOptions& options,
                     std::deque<std::string>& rewritten, std::vector<std::string_view>& out) {
  std::string text = replace_all(piece, " ", options.replacement);
  using Prepend = MetaspaceOptions::Prepend;
  const bool prepend =
      options.prepend == Prepend::kAlways || (options.prepend == Prepend::kFirst && at_input_start);
  if (prepend && !text.starts_with(options.replacement)) text.insert(0, options.replacement);
  const std::string_view result = rewritten.emplace_back(std::move(text));
  if (!options.split) {
    out.push_back(result);
    return;
  }
  // tokenizers' MergedWithNext: each replacement starts a piece.
  size_t start = 0;
  for (size_t found = result.find(options.replacement, 1); found != std::string_view::npos;
       found = result.find(options.replacement, found + options.replacement.size())) {
    out.push_back(result.substr(start, found - start));
    start = found;
  }
  out.push_back(result.substr(start));
}

}  // namespace

MetaspaceOptions MetaspaceOptions::read(const JsonFields& fields) {
  fields.allow_only(
      {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
  MetaspaceOptions options;
  options.replacement = fields.character("replacement");
  options.split = fields.boolean("split", true);
  if (fields.find("prepend_scheme") != nullptr) {
    const std::string scheme = fields.string("prepend_scheme");
    if (scheme == "first") {
      options.prepend = Prepend::kFirst;
    } else if (scheme == "never") {
      options.prepend = Prepend::kNever;
    } else {
      LAYUP_CHECK(scheme == "always", fields.source(), ": ", fields.name("prepend_scheme"),
                  " is \"", scheme, "\"; tokenizers knows \"always\", \"first\" and \"never\"");
    }
  }
  // As tokenizers reads older files: add_prefix_space false must come with "never".
  if (!fields.boolean("add_prefix_space", true)) {
    LAYUP_CHECK(options.prepend == Prepend::kNever, fields.source(), ": ",
                fields.name("add_prefix_space"),
                " is false but prepend_scheme is not \"never\"; tokenizers refuses the file");
  }
  return options;
}

HfPreTokenizer HfPreTokenizer::read(const Json* pre_tokenizer, const std::string& source) {
  HfPreTokenizer result;
  if (pre_tokenizer == nullptr) return result;
  const JsonFields fields(*pre_tokenizer, "pre_tokenizer", source);
  if (fields.string("type") == "Sequence") {
    fields.allow_only({"type", "pretokenizers"});
    const Json& steps = fields.array("pretokenizers");
    for (size_t i = 0; i < steps.size(); ++i) {
      result.read_step(steps[i], json_element("pre_tokenizer.pretokenizers", i), source);
    }
  } else {
    result.read_step(*pre_tokenizer, "pre_tokenizer", source);
  }
  return result;
}

void HfPreTokenizer::read_step(const Json& value, const std::string& path,
                               const std::string& source) {
  const JsonFields fields(value, path, source);
  const std::string type = fields.string("type");
  // What follows ByteLevel would see the text already spelled in the byte alphabet.
  LAYUP_CHECK(!byte_level_, source, ": ", path, " (", type,
              ") comes after the ByteLevel step; layup needs ByteLevel last");
  Step step;
  if (type == "ByteLevel") {
    fields.allow_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    fields.require("add_prefix_space", false,
                   "it puts a space before the text, which layup does not do");
    step.kind = Step::Kind::kByteLevel;
    if (fields.boolean("use_regex", true)) step.pattern.emplace(kGpt2Pattern, path);
    byte_level_ = true;
  } else if (type == "Split") {
    fields.allow_only({"type", "pattern", "behavior", "invert"});
    const std::string behavior = fields.string("behavior");
    LAYUP_CHECK(behavior == "Isolated", source, ": ", path, ".behavior is \"", behavior,
                "\"; layup implements \"Isolated\" only (every match its own piece)");
    fields.require("invert", false, "it splits on what the pattern does not match");
    const JsonFields pattern(fields.at("pattern"), path + ".pattern", source);
    pattern.allow_only({"Regex", "String"});
    step.kind = Step::Kind::kSplit;
    if (pattern.find("Regex") != nullptr) {
      step.pattern.emplace(pattern.string("Regex"), source + ": " + path + ".pattern.Regex");
    } else {
      step.pattern =
          SplitPattern::literal(pattern.string("String"), source + ": " + path + ".pattern.String");
    }
  } else if (type == "Digits") {
    fields.allow_only({"type", "individual_digits"});
    step.kind = Step::Kind::kDigits;
    step.individual_digits = fields.boolean("individual_digits", false);
  } else if (type == "Metaspace") {
    step.kind = Step::Kind::kMetaspace;
    step.metaspace = MetaspaceOptions::read(fields);
  } else {
    fail(source, ": ", path, ".type is \"", type,
         "\"; layup reads the pre-tokenizers Split (behavior Isolated), Digits, Metaspace and "
         "ByteLevel, alone or in a Sequence");
  }
  steps_.push_back(std::move(step));
}

void HfPreTokenizer::split(std::string_view text, bool at_input_start,
                           std::deque<std::string>& rewritten,
                           std::vector<std::string_view>& pieces) const {
  std::vector<std::string_view> current{text}, next;
  for (const Step& step : steps_) {
    if (step.kind == Step::Kind::kByteLevel && !step.pattern) continue;
    next.clear();
    for (size_t i = 0; i < current.size(); ++i) {
      // The pieces are consecutive and none is empty, so only the first can start the input.
      const bool starts_input = at_input_start && i == 0;
      switch (step.kind) {
        case Step::Kind::kSplit:
        case Step::Kind::kByteLevel:
          step.pattern->split(current[i], next);
          break;
        case Step::Kind::kDigits:
          split_digits(current[i], step.individual_digits, next);
          break;
        case Step::Kind::kMetaspace:
          split_metaspace(current[i], starts_input, step.metaspace, rewritten, next);
          break;
      }
    }
    current.swap(next);
  }
  pieces.insert(pieces.end(), current.begin(), current.end());
}

}  // namespace layup
