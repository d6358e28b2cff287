// Reading a tokenizer.json object field by field, for the readers of its parts (hf_*.cpp): every
// error names the file and the field, and a field a reader does not know is refused rather than
// ignored, since it might change the ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace layup {

// A value as an error message quotes it: its JSON type and its text, cut short.
std::string describe_json(const nlohmann::json& value);

// "decoder.decoders[2]".
std::string json_element(std::string_view array_path, size_t index);

// One JSON object of the file. `path` ("model", "added_tokens[3]"; empty for the top level) and
// `source` (the file) start every error.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& value, std::string path, std::string source);

  // Refuses a field not among `known`.
  void allow_only(std::initializer_list<std::string_view> known) const;
  // Refuses the field unless it is absent, null, or `allowed`: for options layup does not
  // implement, `why` says what they would do.
  void require(std::string_view key, const nlohmann::json& allowed, std::string_view why) const;

  // "path.key", for messages.
  std::string name(std::string_view key) const;
  // The field, or nullptr when it is absent or null.
  const nlohmann::json* find(std::string_view key) const;
  const nlohmann::json& at(std::string_view key) const;
  std::string string(std::string_view key) const;
  // A string of exactly one character (code point), as tokenizers' `char` fields.
  std::string character(std::string_view key) const;
  bool boolean(std::string_view key, bool if_absent) const;
  int64_t integer(std::string_view key) const;
  const nlohmann::json& array(std::string_view key) const;

  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }

 private:
  const nlohmann::json& value_;
  std::string path_;
  std::string source_;
};

}  // namespace layup
