// Field-by-field reading of tokenizer.json objects, with errors that name the field.
#include "tokenizer/tokenizer_json_fields.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "tokenizer/tokenizer_files.h"
#include "tokenizer/utf8.h"

namespace layup {

using Json = nlohmann::json;

std::string describe_json(const Json& value) {
  const std::string text = value.dump();
  return std::string(value.type_name()) + " " +
         (text.size() > 60 ? text.substr(0, 57) + "..." : text);
}

std::string json_element(std::string_view array_path, size_t index) {
  return std::string(array_path) + "[" + std::to_string(index) + "]";
}

JsonFields::JsonFields(const Json& value, std::string path, std::string source)
    : value_(value), path_(std::move(path)), source_(std::move(source)) {
  LAYUP_CHECK(value.is_object(), source_, ": ", path_.empty() ? "the top level" : path_,
              " must be a JSON object, found ", describe_json(value));
}

void JsonFields::allow_only(std::initializer_list<std::string_view> known) const {
  for (const auto& item : value_.items()) {
    if (std::find(known.begin(), known.end(), item.key()) == known.end()) {
      fail(source_, ": ", name(item.key()),
           " is a field layup does not know; it is refused rather than ignored, as it may "
           "change the tokens");
    }
  }
}

void JsonFields::require(std::string_view key, const Json& allowed, std::string_view why) const {
  const Json* value = find(key);
  if (value == nullptr || *value == allowed) return;
  fail(source_, ": ", name(key), " is ", value->dump(), "; layup supports only ", allowed.dump(),
       " (", why, ")");
}

std::string JsonFields::name(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const Json* JsonFields::find(std::string_view key) const {
  const auto found = value_.find(key);
  return found == value_.end() || found->is_null() ? nullptr : &*found;
}

const Json& JsonFields::at(std::string_view key) const {
  const Json* value = find(key);
  LAYUP_CHECK(value != nullptr, source_, ": ", name(key), " is missing");
  return *value;
}

std::string JsonFields::string(std::string_view key) const {
  const Json& value = at(key);
  LAYUP_CHECK(value.is_string(), source_, ": ", name(key), " must be a string, found ",
              describe_json(value));
  return value.get<std::string>();
}

std::string JsonFields::character(std::string_view key) const {
  std::string text = string(key);
  LAYUP_CHECK(!text.empty() && decode_utf8_at(text, 0).valid &&
                  static_cast<size_t>(decode_utf8_at(text, 0).byte_count) == text.size(),
              source_, ": ", name(key), " is ", quoted(text), "; it must be one character");
  return text;
}

bool JsonFields::boolean(std::string_view key, bool if_absent) const {
  const Json* value = find(key);
  if (value == nullptr) return if_absent;
  LAYUP_CHECK(value->is_boolean(), source_, ": ", name(key), " must be true or false, found ",
              describe_json(*value));
  return value->get<bool>();
}

int64_t JsonFields::integer(std::string_view key) const {
  const Json& value = at(key);
  LAYUP_CHECK(value.is_number_integer(), source_, ": ", name(key), " must be an integer, found ",
              describe_json(value));
  return value.get<int64_t>();
}

const Json& JsonFields::array(std::string_view key) const {
  const Json& value = at(key);
  LAYUP_CHECK(value.is_array(), source_, ": ", name(key), " must be a JSON array, found ",
              describe_json(value));
  return value;
}

}  // namespace layup
