// The values a chat template computes with, as jinja2 sees Python's: undefined, none, booleans,
// integers, strings, lists (and tuples), dicts with string keys, namespace() objects and the
// few global functions. Lists and dicts are shared, as Python's are; only a namespace is ever
// changed after it is made ({% set ns.x = ... %}).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace layup::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order, as Python's

struct Value {
  enum class Kind { Undefined, None, Bool, Int, String, List, Dict, Namespace, Function };
  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;  // a String's text; an Undefined's or a Function's name
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // a Dict's or a Namespace's entries

  static Value undefined(std::string what) { return make(Kind::Undefined, std::move(what)); }
  static Value none() { return make(Kind::None); }
  static Value of(bool b) {
    Value v = make(Kind::Bool);
    v.boolean = b;
    return v;
  }
  static Value of(int64_t i) {
    Value v = make(Kind::Int);
    v.integer = i;
    return v;
  }
  static Value of(std::string s) { return make(Kind::String, std::move(s)); }
  // Without it a string literal would convert to bool.
  static Value of(const char* s) { return of(std::string(s)); }
  static Value of(List items) {
    Value v = make(Kind::List);
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value of(Dict entries) {
    Value v = make(Kind::Dict);
    v.dict = std::make_shared<Dict>(std::move(entries));
    return v;
  }
  static Value namespace_of(Dict entries) {
    Value v = of(std::move(entries));
    v.kind = Kind::Namespace;
    return v;
  }
  static Value function(std::string name) { return make(Kind::Function, std::move(name)); }
  static Value make(Kind kind, std::string text = {}) {
    Value v;
    v.kind = kind;
    v.string = std::move(text);
    return v;
  }

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Bool; }
  // A Dict's or Namespace's entry; nullptr where there is none.
  const Value* find(const std::string& key) const;
};

// Python's bool(value).
bool truthy(const Value& value);
// Python's str(value) as jinja2 prints it ("" for undefined, "None", "True"); a layup::Error for
// a list, dict or namespace, whose Python spelling is not reproduced.
std::string to_text(const Value& value);
// Python's type name, for error messages ("str", "list", "NoneType").
std::string type_name(const Value& value);
// Python's ==.
bool equal(const Value& a, const Value& b);
// json.dumps(value, ensure_ascii=False, indent=indent) (transformers' tojson); indent < 0: none.
std::string to_json(const Value& value, int indent);

// Strings are indexed by code point, as Python's are.
std::vector<std::string> code_points(const std::string& text);

}  // namespace layup::jinja
