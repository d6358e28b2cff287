// Reading and running a tokenizer.json normalizer; see hf_normalizer.h.
#include "tokenizer/hf_normalizer.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/tokenizer_json_fields.h"

namespace layup {

using Json = nlohmann::json;

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view content) {
  std::string result;
  result.reserve(text.size());
  size_t start = 0;
  for (size_t found = text.find(pattern); found != std::string_view::npos;
       found = text.find(pattern, start)) {
    result.append(text.substr(start, found - start));
    result.append(content);
    start = found + pattern.size();
  }
  result.append(text.substr(start));
  return result;
}

HfNormalizer HfNormalizer::read(const Json& normalizer, const std::string& source) {
  HfNormalizer result;
  result.read_step(normalizer, "normalizer", source);
  return result;
}

void HfNormalizer::read_step(const Json& value, const std::string& path,
                             const std::string& source) {
  const JsonFields fields(value, path, source);
  const std::string type = fields.string("type");
  const std::pair<std::string_view, NormalizationForm> kForms[] = {
      {"NFC", NormalizationForm::kNfc},
      {"NFD", NormalizationForm::kNfd},
      {"NFKC", NormalizationForm::kNfkc},
      {"NFKD", NormalizationForm::kNfkd}};
  for (const auto& [name, form] : kForms) {
    if (type != name) continue;
    fields.allow_only({"type"});
    steps_.push_back({Step::Kind::kUnicode, form, "", ""});
    return;
  }
  if (type == "Sequence") {
    fields.allow_only({"type", "normalizers"});
    const Json& normalizers = fields.array("normalizers");
    for (size_t i = 0; i < normalizers.size(); ++i) {
      read_step(normalizers[i], json_element(path + ".normalizers", i), source);
    }
  } else if (type == "Prepend") {
    fields.allow_only({"type", "prepend"});
    steps_.push_back({Step::Kind::kPrepend, {}, "", fields.string("prepend")});
  } else if (type == "Replace") {
    fields.allow_only({"type", "pattern", "content"});
    const JsonFields pattern(fields.at("pattern"), path + ".pattern", source);
    LAYUP_CHECK(pattern.find("Regex") == nullptr, source, ": ", path,
                ".pattern is a Regex; layup's Replace normalizer takes a String pattern only");
    pattern.allow_only({"String"});
    Step step{Step::Kind::kReplace, {}, pattern.string("String"), fields.string("content")};
    LAYUP_CHECK(!step.pattern.empty(), source, ": ", path, ".pattern.String is empty");
    steps_.push_back(std::move(step));
  } else {
    fail(source, ": ", path, ".type is \"", type,
         "\"; layup implements the normalizers NFC, NFD, NFKC, NFKD, Prepend and Replace (a String "
         "pattern), alone or in a Sequence, and encoding without this one would give other ids");
  }
}

std::string HfNormalizer::normalize(std::string_view text) const {
  std::string result(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Step::Kind::kUnicode:
        result = normalize_unicode(result, step.form);
        break;
      case Step::Kind::kPrepend:
        if (!result.empty()) result.insert(0, step.content);
        break;
      case Step::Kind::kReplace:
        result = replace_all(result, step.pattern, step.content);
        break;
    }
  }
  return result;
}

}  // namespace layup
