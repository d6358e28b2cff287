// Python's semantics for the jinja values (jinja_value.h).
#include "tokenizer/jinja_value.h"

#include <cstdio>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace layup::jinja {

const Value* Value::find(const std::string& key) const {
  if (!dict) return nullptr;
  for (const auto& [name, value] : *dict)
    if (name == key) return &value;
  return nullptr;
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return value.boolean;
    case Value::Kind::Int:
      return value.integer != 0;
    case Value::Kind::String:
      return !value.string.empty();
    case Value::Kind::List:
      return !value.list->empty();
    case Value::Kind::Dict:
      return !value.dict->empty();
    case Value::Kind::Namespace:
    case Value::Kind::Function:
      return true;
  }
  return false;
}

std::string type_name(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::String:
      return "str";
    case Value::Kind::List:
      return "list";
    case Value::Kind::Dict:
      return "dict";
    case Value::Kind::Namespace:
      return "Namespace";
    case Value::Kind::Function:
      return "function";
  }
  return "?";
}

std::string to_text(const Value& value) {
  switch (value.kind) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return value.boolean ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(value.integer);
    case Value::Kind::String:
      return value.string;
    default:
      fail("chat template: printing a ", type_name(value),
           " as text is not supported (use |tojson or print its items)");
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    const int64_t x = a.kind == Value::Kind::Bool ? a.boolean : a.integer;
    const int64_t y = b.kind == Value::Kind::Bool ? b.boolean : b.integer;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
    case Value::Kind::Function:
      return a.string == b.string;
    case Value::Kind::List:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, item] : *a.dict) {
        const Value* other = b.find(key);
        if (!other || !equal(item, *other)) return false;
      }
      return true;
    case Value::Kind::Namespace:
      return a.dict == b.dict;
    default:
      return false;
  }
}

namespace {

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04x", static_cast<unsigned char>(c));
          out += escape;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// json.dumps's layout: ", " and ": " without indent; with it, each item on its own line.
void append_json(std::string& out, const Value& value, int indent, int depth) {
  const auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * level, ' ');
  };
  const char* separator = indent < 0 ? ", " : ",";
  switch (value.kind) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += value.boolean ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(value.integer);
      return;
    case Value::Kind::String:
      append_json_string(out, value.string);
      return;
    case Value::Kind::List:
      if (value.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < value.list->size(); ++i) {
        if (i) out += separator;
        newline(depth + 1);
        append_json(out, (*value.list)[i], indent, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    case Value::Kind::Dict:
      if (value.dict->empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < value.dict->size(); ++i) {
        if (i) out += separator;
        newline(depth + 1);
        append_json_string(out, (*value.dict)[i].first);
        out += ": ";
        append_json(out, (*value.dict)[i].second, indent, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    default:
      fail("chat template: tojson of a ", type_name(value), " is not supported");
  }
}

}  // namespace

std::string to_json(const Value& value, int indent) {
  std::string out;
  append_json(out, value, indent, 0);
  return out;
}

std::vector<std::string> code_points(const std::string& text) {
  std::vector<std::string> points;
  for (size_t i = 0; i < text.size();) {
    const int length = decode_utf8_at(text, i).byte_count;
    points.push_back(text.substr(i, length));
    i += length;
  }
  return points;
}

}  // namespace layup::jinja
