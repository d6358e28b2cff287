// The chat template evaluator (jinja_render.h).
#include "tokenizer/jinja_render.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <map>

#include "core/error.h"
#include "tokenizer/jinja_lexer.h"
#include "tokenizer/utf8.h"

namespace layup::jinja {

std::vector<std::pair<std::string, Value>> builtin_globals() {
  return {{"raise_exception", Value::function("raise_exception")},
          {"namespace", Value::function("namespace")},
          {"range", Value::function("range")},
          {"strftime_now", Value::function("strftime_now")}};
}

namespace {

enum class Flow { Normal, Break, Continue };

// Names that Python finds as methods before jinja2 would look up a key or give Undefined: used
// uncalled they would print as a bound method, which is not reproduced.
const std::vector<std::string> kDictMethods = {"clear",      "copy",   "fromkeys", "get",
                                               "items",      "keys",   "pop",      "popitem",
                                               "setdefault", "update", "values"};
const std::vector<std::string> kStringMethods = {
    "strip", "lstrip",  "rstrip", "startswith", "endswith", "split", "upper",
    "lower", "replace", "title",  "capitalize", "format",   "join",  "find"};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

int64_t as_int(const Value& value) {
  return value.kind == Value::Kind::Bool ? value.boolean : value.integer;
}

// Python's str.strip(chars) family; chars null: whitespace.
std::string strip(const std::string& text, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> points = code_points(text);
  const auto strippable = [&](const std::string& point) {
    if (chars) return chars->find(point) != std::string::npos;
    const Utf8CodePoint decoded = decode_utf8_at(point, 0);
    return decoded.valid && is_python_space(decoded.code_point);
  };
  size_t begin = 0, end = points.size();
  if (left)
    while (begin < end && strippable(points[begin])) ++begin;
  if (right)
    while (end > begin && strippable(points[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) out += points[i];
  return out;
}

std::string change_case(const std::string& text, bool upper, int line) {
  std::string out = text;
  for (char& c : out) {
    LAYUP_CHECK(static_cast<unsigned char>(c) < 0x80, "chat template line ", line,
                ": upper/lower of non-ASCII text is not supported");
    if (upper && c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (!upper && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Python's slice.indices, then the items it picks.
template <class Item>
std::vector<Item> slice_of(const std::vector<Item>& items, const Value* start, const Value* stop,
                           const Value* step, int line) {
  const int64_t length = static_cast<int64_t>(items.size());
  const auto given = [](const Value* v) { return v && v->kind != Value::Kind::None; };
  for (const Value* v : {start, stop, step})
    LAYUP_CHECK(!given(v) || v->is_number(), "chat template line ", line,
                ": slice bounds must be integers");
  const int64_t stride = given(step) ? as_int(*step) : 1;
  LAYUP_CHECK(stride != 0, "chat template line ", line, ": a slice step cannot be zero");
  const int64_t lower = stride > 0 ? 0 : -1, upper = stride > 0 ? length : length - 1;
  const auto bound = [&](const Value* v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = as_int(*v);
    if (i < 0) i = std::max(i + length, lower);
    return std::min(i, upper);
  };
  const int64_t from = bound(start, stride > 0 ? lower : upper);
  const int64_t to = bound(stop, stride > 0 ? upper : lower);
  std::vector<Item> out;
  for (int64_t i = from; stride > 0 ? i < to : i > to; i += stride)
    out.push_back(items[static_cast<size_t>(i)]);
  return out;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& part : parts) out += part;
  return out;
}

class Renderer {
 public:
  explicit Renderer(const std::vector<std::pair<std::string, Value>>& globals) {
    scopes_.emplace_back(globals.begin(), globals.end());
  }

  std::string run(const std::vector<Node>& nodes) {
    exec(nodes);
    return std::move(out_);
  }

 private:
  [[noreturn]] static void error(int line, const std::string& what) {
    fail("chat template line ", line, ": ", what);
  }

  // An undefined value may only be printed, tested, iterated or measured.
  static void require_defined(const Value& value, int line) {
    if (value.is_undefined()) error(line, value.string);
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto found = scope->find(name);
      if (found != scope->end()) return found->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Flow exec(const std::vector<Node>& nodes) {
    for (const Node& node : nodes) {
      const Flow flow = exec(node);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& node) {
    switch (node.type) {
      case Node::Type::Text:
        out_ += node.text;
        break;
      case Node::Type::Output:
        out_ += text_of(eval(*node.expr), node.line);
        break;
      case Node::Type::If:
        for (const auto& [condition, body] : node.branches)
          if (!condition || truthy(eval(*condition))) return exec(body);
        break;
      case Node::Type::For:
        return exec_for(node);
      case Node::Type::Set:
        scopes_.back()[node.targets[0]] = eval(*node.expr);
        break;
      case Node::Type::SetAttribute: {
        const Value target = lookup(node.targets[0]);
        if (target.kind != Value::Kind::Namespace)
          error(node.line, "can only set attributes of a namespace(), and '" + node.targets[0] +
                               "' is a " + type_name(target));
        const Value value = eval(*node.expr);
        for (auto& entry : *target.dict) {
          if (entry.first == node.targets[1]) {
            entry.second = value;
            return Flow::Normal;
          }
        }
        target.dict->emplace_back(node.targets[1], value);
        break;
      }
      case Node::Type::Break:
        return Flow::Break;
      case Node::Type::Continue:
        return Flow::Continue;
      case Node::Type::Block:
        return exec(node.body);
    }
    return Flow::Normal;
  }

  static std::string text_of(const Value& value, int line) {
    if (value.kind == Value::Kind::List || value.kind == Value::Kind::Dict ||
        value.kind == Value::Kind::Namespace || value.kind == Value::Kind::Function)
      error(line, "printing a " + type_name(value) + " is not supported");
    return to_text(value);
  }

  // The items a for loop (or a filter) walks: a dict's keys, a string's characters.
  static List items_of(const Value& value, int line) {
    switch (value.kind) {
      case Value::Kind::Undefined:
        return {};
      case Value::Kind::List:
        return *value.list;
      case Value::Kind::Dict: {
        List keys;
        for (const auto& entry : *value.dict) keys.push_back(Value::of(entry.first));
        return keys;
      }
      case Value::Kind::String: {
        List characters;
        for (std::string& point : code_points(value.string))
          characters.push_back(Value::of(std::move(point)));
        return characters;
      }
      default:
        error(line, "'" + type_name(value) + "' object is not iterable");
    }
  }

  void bind(std::map<std::string, Value>& scope, const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      scope[node.targets[0]] = item;
      return;
    }
    if (item.kind != Value::Kind::List || item.list->size() != node.targets.size())
      error(node.line, "cannot unpack a " + type_name(item) + " into " +
                           std::to_string(node.targets.size()) + " loop variables");
    for (size_t i = 0; i < node.targets.size(); ++i) scope[node.targets[i]] = (*item.list)[i];
  }

  Flow exec_for(const Node& node) {
    List items = items_of(eval(*node.expr), node.line);
    if (node.filter) {
      List kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(scopes_.back(), node, item);
        const bool keep = truthy(eval(*node.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      scopes_.emplace_back();
      exec(node.else_body);
      scopes_.pop_back();
      return Flow::Normal;
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      scopes_.emplace_back();
      bind(scopes_.back(), node, items[i]);
      scopes_.back()["loop"] = Value::of(Dict{
          {"index0", Value::of(i)},
          {"index", Value::of(i + 1)},
          {"revindex0", Value::of(length - i - 1)},
          {"revindex", Value::of(length - i)},
          {"first", Value::of(i == 0)},
          {"last", Value::of(i == length - 1)},
          {"length", Value::of(length)},
          {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
          {"nextitem", i + 1 < length ? items[i + 1] : Value::undefined("there is no next item")},
      });
      const Flow flow = exec(node.body);
      scopes_.pop_back();
      if (flow == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e) {
    switch (e.type) {
      case Expr::Type::Literal:
        return e.value;
      case Expr::Type::Name:
        return lookup(e.name);
      case Expr::Type::List: {
        List items;
        for (const auto& arg : e.args) items.push_back(eval(*arg));
        return Value::of(std::move(items));
      }
      case Expr::Type::DictLiteral: {
        Dict entries;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i]);
          if (key.kind != Value::Kind::String) error(e.line, "dict keys must be strings");
          Value value = eval(*e.args[i + 1]);
          auto found = std::find_if(entries.begin(), entries.end(),
                                    [&](const auto& entry) { return entry.first == key.string; });
          if (found != entries.end()) {
            found->second = std::move(value);
          } else {
            entries.emplace_back(key.string, std::move(value));
          }
        }
        return Value::of(std::move(entries));
      }
      case Expr::Type::Attribute:
        return attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Type::Subscript:
        return subscript(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Type::Slice:
        return slice(e);
      case Expr::Type::Call:
        return call(e);
      case Expr::Type::Filter:
        return filter(e);
      case Expr::Type::Test:
        return Value::of(test(e.name, eval(*e.args[0]), args(e), e.line) != e.negated);
      case Expr::Type::Not:
        return Value::of(!truthy(eval(*e.args[0])));
      case Expr::Type::Negate: {
        const Value value = eval(*e.args[0]);
        require_defined(value, e.line);
        if (!value.is_number()) error(e.line, "cannot negate a " + type_name(value));
        if (as_int(value) == INT64_MIN) error(e.line, "integer overflow in -");
        return Value::of(-as_int(value));
      }
      case Expr::Type::Binary:
        return binary(e);
      case Expr::Type::Compare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          if (!compare(e.ops[i], left, right, e.line)) return Value::of(false);
          left = std::move(right);
        }
        return Value::of(true);
      }
      case Expr::Type::Conditional:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("the condition was false");
    }
    return Value::none();
  }

  // The positional arguments after args[0] (a filter's or test's value, a call's callee).
  std::vector<Value> args(const Expr& e) {
    std::vector<Value> values;
    for (size_t i = 1; i < e.args.size(); ++i) values.push_back(eval(*e.args[i]));
    return values;
  }

  static Value attribute(const Value& object, const std::string& name, int line) {
    require_defined(object, line);
    if (object.kind == Value::Kind::Dict && contains(kDictMethods, name))
      error(line, "the dict method '" + name + "' used without calling it is not supported");
    if (object.kind == Value::Kind::String && contains(kStringMethods, name))
      error(line, "the string method '" + name + "' used without calling it is not supported");
    if (const Value* found = object.find(name)) return *found;
    return Value::undefined("'" + type_name(object) + " object' has no attribute '" + name + "'");
  }

  static Value subscript(const Value& object, const Value& key, int line) {
    require_defined(object, line);
    if (object.kind == Value::Kind::Dict || object.kind == Value::Kind::Namespace) {
      if (key.kind == Value::Kind::String)
        if (const Value* found = object.find(key.string)) return *found;
      return Value::undefined("'" + type_name(object) + " object' has no item '" + to_text(key) +
                              "'");
    }
    if ((object.kind == Value::Kind::List || object.kind == Value::Kind::String) &&
        key.is_number()) {
      const std::vector<std::string> points = object.kind == Value::Kind::String
                                                  ? code_points(object.string)
                                                  : std::vector<std::string>{};
      const int64_t length = object.kind == Value::Kind::List
                                 ? static_cast<int64_t>(object.list->size())
                                 : static_cast<int64_t>(points.size());
      int64_t index = as_int(key);
      if (index < 0) index += length;
      if (index < 0 || index >= length)
        return Value::undefined("index " + std::to_string(as_int(key)) + " is out of range");
      if (object.kind == Value::Kind::List) return (*object.list)[static_cast<size_t>(index)];
      return Value::of(points[static_cast<size_t>(index)]);
    }
    return Value::undefined("'" + type_name(object) + " object' has no item '" + to_text(key) +
                            "'");
  }

  Value slice(const Expr& e) {
    const Value object = eval(*e.args[0]);
    Value bounds[3];
    for (int i = 0; i < 3; ++i)
      if (e.args[1 + i]) bounds[i] = eval(*e.args[1 + i]);
    const auto bound = [&](int i) { return e.args[1 + i] ? &bounds[i] : nullptr; };
    require_defined(object, e.line);
    if (object.kind == Value::Kind::List)
      return Value::of(slice_of(*object.list, bound(0), bound(1), bound(2), e.line));
    if (object.kind == Value::Kind::String)
      return Value::of(
          join(slice_of(code_points(object.string), bound(0), bound(1), bound(2), e.line)));
    error(e.line, "slicing a " + type_name(object) + " is not supported");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    Value left = eval(*e.args[0]);
    if (op == "and") return truthy(left) ? eval(*e.args[1]) : left;
    if (op == "or") return truthy(left) ? left : eval(*e.args[1]);
    const Value right = eval(*e.args[1]);
    if (op == "~") return Value::of(text_of(left, e.line) + text_of(right, e.line));
    if (op == "%" && left.kind == Value::Kind::String)
      error(e.line, "string formatting with % is not supported");
    require_defined(left, e.line);
    require_defined(right, e.line);
    if (op == "+" && left.kind == Value::Kind::String && right.kind == Value::Kind::String)
      return Value::of(left.string + right.string);
    if (op == "+" && left.kind == Value::Kind::List && right.kind == Value::Kind::List) {
      List items = *left.list;
      items.insert(items.end(), right.list->begin(), right.list->end());
      return Value::of(std::move(items));
    }
    if (op == "*" && (left.kind == Value::Kind::String || left.kind == Value::Kind::List ||
                      right.kind == Value::Kind::String || right.kind == Value::Kind::List))
      return repeat(left, right, e.line);
    if (!left.is_number() || !right.is_number())
      error(e.line, "unsupported operand types for " + op + ": '" + type_name(left) + "' and '" +
                        type_name(right) + "'");
    const int64_t a = as_int(left), b = as_int(right);
    // Python's integers do not overflow; layup's refuse to rather than wrap.
    int64_t result = 0;
    if ((op == "+" && __builtin_add_overflow(a, b, &result)) ||
        (op == "-" && __builtin_sub_overflow(a, b, &result)) ||
        (op == "*" && __builtin_mul_overflow(a, b, &result)) || (b == -1 && a == INT64_MIN))
      error(e.line, "integer overflow in " + op);
    if (op == "+" || op == "-" || op == "*") return Value::of(result);
    if (b == 0) error(e.line, "integer division or modulo by zero");
    // Python's // and % round towards negative infinity.
    int64_t quotient = a / b, remainder = a % b;
    if (remainder != 0 && ((remainder < 0) != (b < 0))) {
      --quotient;
      remainder += b;
    }
    return Value::of(op == "//" ? quotient : remainder);
  }

  // Python's sequence * count (either way round): the sequence repeated, empty for count <= 0.
  static Value repeat(const Value& left, const Value& right, int line) {
    const bool left_is_count = left.is_number();
    const Value& sequence = left_is_count ? right : left;
    const Value& count = left_is_count ? left : right;
    if (!count.is_number())
      error(line, "can't multiply a " + type_name(sequence) + " by a " + type_name(count));
    const int64_t times = as_int(count);
    const size_t size =
        sequence.kind == Value::Kind::String ? sequence.string.size() : sequence.list->size();
    if (times > 0 && size > 0 && static_cast<uint64_t>(times) > (1u << 20) / size)
      error(line, "a repeated sequence would be too long");
    std::string text;
    List items;
    for (int64_t i = 0; i < times; ++i) {
      if (sequence.kind == Value::Kind::String) {
        text += sequence.string;
      } else {
        items.insert(items.end(), sequence.list->begin(), sequence.list->end());
      }
    }
    return sequence.kind == Value::Kind::String ? Value::of(std::move(text))
                                                : Value::of(std::move(items));
  }

  static bool compare(const std::string& op, const Value& left, const Value& right, int line) {
    if (op == "==") return equal(left, right);
    if (op == "!=") return !equal(left, right);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (right.kind == Value::Kind::String) {
        if (left.kind != Value::Kind::String)
          error(line, "'in <string>' requires a string on the left, not a " + type_name(left));
        found = right.string.find(left.string) != std::string::npos;
      } else if (right.kind == Value::Kind::Dict) {
        if (left.kind == Value::Kind::List || left.kind == Value::Kind::Dict)
          error(line, "unhashable type: '" + type_name(left) + "'");
        found = left.kind == Value::Kind::String && right.find(left.string);
      } else if (right.kind == Value::Kind::List) {
        found = std::any_of(right.list->begin(), right.list->end(),
                            [&](const Value& item) { return equal(left, item); });
      } else if (!right.is_undefined()) {
        error(line, "'in' needs a string, list or dict on the right, not a " + type_name(right));
      }
      return found == (op == "in");
    }
    require_defined(left, line);
    require_defined(right, line);
    int order = 0;
    if (left.is_number() && right.is_number()) {
      order = as_int(left) < as_int(right) ? -1 : as_int(left) > as_int(right);
    } else if (left.kind == Value::Kind::String && right.kind == Value::Kind::String) {
      // UTF-8 byte order is code point order, Python's string order.
      order = left.string.compare(right.string);
      order = order < 0 ? -1 : order > 0;
    } else {
      error(line, "'" + op + "' is not supported between a " + type_name(left) + " and a " +
                      type_name(right));
    }
    if (op == "<") return order < 0;
    if (op == ">") return order > 0;
    if (op == "<=") return order <= 0;
    return order >= 0;
  }

  static bool test(const std::string& name, const Value& value, const std::vector<Value>& args,
                   int line) {
    const auto want_args = [&](size_t count) {
      if (args.size() != count)
        error(line, "the test '" + name + "' takes " + std::to_string(count) + " argument(s)");
    };
    want_args(name == "equalto" || name == "eq" || name == "ne" ? 1 : 0);
    const Value::Kind kind = value.kind;
    if (name == "defined") return kind != Value::Kind::Undefined;
    if (name == "undefined") return kind == Value::Kind::Undefined;
    if (name == "none") return kind == Value::Kind::None;
    if (name == "string") return kind == Value::Kind::String;
    if (name == "number") return value.is_number();
    if (name == "integer") return kind == Value::Kind::Int;
    if (name == "boolean") return kind == Value::Kind::Bool;
    if (name == "true") return kind == Value::Kind::Bool && value.boolean;
    if (name == "false") return kind == Value::Kind::Bool && !value.boolean;
    if (name == "mapping") return kind == Value::Kind::Dict;
    if (name == "iterable")
      return kind == Value::Kind::Undefined || kind == Value::Kind::String ||
             kind == Value::Kind::List || kind == Value::Kind::Dict;
    if (name == "equalto" || name == "eq") return equal(value, args[0]);
    if (name == "ne") return !equal(value, args[0]);
    require_defined(value, line);
    if (!value.is_number()) error(line, "the test '" + name + "' needs a number");
    return (as_int(value) % 2 != 0) == (name == "odd");
  }

  // Keyword arguments by name (each must be one the caller knows); positional ones fill the
  // names in order.
  std::vector<Value> named_args(const Expr& e, const std::vector<std::string>& names,
                                const std::string& what) {
    std::vector<Value> values = args(e);
    if (values.size() > names.size())
      error(e.line, what + " takes at most " + std::to_string(names.size()) + " argument(s)");
    values.resize(names.size());
    for (const auto& [key, expr] : e.kwargs) {
      const auto found = std::find(names.begin(), names.end(), key);
      if (found == names.end()) error(e.line, what + " has no argument '" + key + "' here");
      values[static_cast<size_t>(found - names.begin())] = eval(*expr);
    }
    return values;
  }

  Value filter(const Expr& e) {
    const std::string& name = e.name;
    const Value value = eval(*e.args[0]);
    const int line = e.line;
    if (name == "default" || name == "d") {
      const std::vector<Value> a = named_args(e, {"default_value", "boolean"}, "default");
      const bool use_default = value.is_undefined() || (truthy(a[1]) && !truthy(value));
      if (!use_default) return value;
      return a[0].is_undefined() ? Value::of(std::string()) : a[0];
    }
    if (name == "length" || name == "count") {
      named_args(e, {}, name);
      if (value.kind == Value::Kind::String)
        return Value::of(static_cast<int64_t>(code_points(value.string).size()));
      if (value.kind == Value::Kind::List || value.kind == Value::Kind::Dict ||
          value.is_undefined())
        return Value::of(static_cast<int64_t>(items_of(value, line).size()));
      error(line, "a " + type_name(value) + " has no length");
    }
    if (name == "trim") {
      const std::vector<Value> a = named_args(e, {"chars"}, "trim");
      const bool given = !a[0].is_undefined() && a[0].kind != Value::Kind::None;
      return Value::of(strip(text_of(value, line), given ? &a[0].string : nullptr, true, true));
    }
    if (name == "upper" || name == "lower") {
      named_args(e, {}, name);
      return Value::of(change_case(text_of(value, line), name == "upper", line));
    }
    if (name == "string") {
      named_args(e, {}, name);
      return Value::of(text_of(value, line));
    }
    if (name == "tojson") {
      const std::vector<Value> a = named_args(e, {"indent"}, "tojson");
      require_defined(value, line);
      if (!a[0].is_undefined() && a[0].kind != Value::Kind::None && !a[0].is_number())
        error(line, "tojson's indent must be an integer");
      return Value::of(to_json(value, a[0].is_number() ? static_cast<int>(as_int(a[0])) : -1));
    }
    if (name == "items") {
      named_args(e, {}, name);
      if (value.is_undefined()) return Value::of(List{});
      if (value.kind != Value::Kind::Dict)
        error(line, "items needs a dict, not a " + type_name(value));
      List pairs;
      for (const auto& [key, item] : *value.dict)
        pairs.push_back(Value::of(List{Value::of(key), item}));
      return Value::of(std::move(pairs));
    }
    if (name == "list") {
      named_args(e, {}, name);
      return Value::of(items_of(value, line));
    }
    if (name == "first" || name == "last") {
      named_args(e, {}, name);
      const List items = items_of(value, line);
      if (items.empty()) return Value::undefined("there is no " + name + " item");
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      const std::vector<Value> a = named_args(e, {"d"}, "join");
      const std::string separator = a[0].is_undefined() ? "" : text_of(a[0], line);
      std::string out;
      bool first = true;
      for (const Value& item : items_of(value, line)) {
        if (!first) out += separator;
        first = false;
        out += text_of(item, line);
      }
      return Value::of(std::move(out));
    }
    // select / reject: a test name and its arguments; selectattr / rejectattr: an attribute
    // first, and without a test, the attribute's truth.
    if (!e.kwargs.empty()) error(line, name + " takes no keyword arguments");
    std::vector<Value> a = args(e);
    const bool by_attribute = name == "selectattr" || name == "rejectattr";
    const bool keep_passing = name == "select" || name == "selectattr";
    std::string attribute_name;
    if (by_attribute) {
      if (a.empty() || a[0].kind != Value::Kind::String)
        error(line, name + " needs the name of an attribute");
      attribute_name = a[0].string;
      a.erase(a.begin());
    }
    const auto picked = [&](const Value& item) {
      return by_attribute ? subscript(item, Value::of(attribute_name), line) : item;
    };
    if (by_attribute && a.empty()) {
      List kept;
      for (const Value& item : items_of(value, line))
        if (truthy(picked(item)) == keep_passing) kept.push_back(item);
      return Value::of(std::move(kept));
    }
    if (a.empty() || a[0].kind != Value::Kind::String)
      error(line, name + " needs the name of a test");
    const std::string test_name = a[0].string;
    a.erase(a.begin());
    static const std::vector<std::string> kTests = {
        "defined",  "undefined", "none",  "string",  "number", "integer", "boolean", "mapping",
        "iterable", "true",      "false", "equalto", "eq",     "ne",      "odd",     "even"};
    if (!contains(kTests, test_name)) error(line, "the test '" + test_name + "' is not supported");
    List kept;
    for (const Value& item : items_of(value, line))
      if (test(test_name, picked(item), a, line) == keep_passing) kept.push_back(item);
    return Value::of(std::move(kept));
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.type == Expr::Type::Attribute) return method(e, eval(*callee.args[0]), callee.name);
    const Value function = lookup(callee.name);
    require_defined(function, e.line);
    if (function.kind != Value::Kind::Function)
      error(e.line, "'" + callee.name + "' is a " + type_name(function) + ", not a function");
    const std::string& name = function.string;
    if (name == "namespace") {
      if (e.args.size() > 1) error(e.line, "namespace() takes keyword arguments only");
      Dict entries;
      for (const auto& [key, expr] : e.kwargs) entries.emplace_back(key, eval(*expr));
      return Value::namespace_of(std::move(entries));
    }
    if (!e.kwargs.empty()) error(e.line, name + "() takes no keyword arguments");
    const std::vector<Value> a = args(e);
    if (name == "raise_exception") {
      if (a.size() != 1) error(e.line, "raise_exception() takes one argument");
      fail("the chat template refuses this conversation: ", text_of(a[0], e.line));
    }
    if (name == "strftime_now") {
      if (a.size() != 1 || a[0].kind != Value::Kind::String)
        error(e.line, "strftime_now() takes one format string");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[1024];
      const size_t length = std::strftime(buffer, sizeof buffer, a[0].string.c_str(), &local);
      if (length == 0 && !a[0].string.empty())
        error(e.line, "strftime_now's format gives no text or too long a text");
      return Value::of(std::string(buffer, length));
    }
    // range(stop) / range(start, stop[, step]); jinja2's sandbox allows at most 100000 items.
    if (a.empty() || a.size() > 3 ||
        !std::all_of(a.begin(), a.end(), [](const Value& v) { return v.is_number(); }))
      error(e.line, "range() takes one to three integers");
    const int64_t start = a.size() == 1 ? 0 : as_int(a[0]);
    const int64_t stop = a.size() == 1 ? as_int(a[0]) : as_int(a[1]);
    const int64_t step = a.size() == 3 ? as_int(a[2]) : 1;
    if (step == 0) error(e.line, "range() step must not be zero");
    List items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (items.size() >= 100000) error(e.line, "range() is too long");
      items.push_back(Value::of(i));
    }
    return Value::of(std::move(items));
  }

  Value method(const Expr& e, const Value& object, const std::string& name) {
    require_defined(object, e.line);
    if (!e.kwargs.empty()) error(e.line, "." + name + "() takes no keyword arguments here");
    const std::vector<Value> a = args(e);
    const auto want_args = [&](size_t lowest, size_t highest) {
      if (a.size() < lowest || a.size() > highest)
        error(e.line, "." + name + "() got " + std::to_string(a.size()) + " argument(s)");
    };
    const auto string_arg = [&](size_t i) -> const std::string& {
      if (a[i].kind != Value::Kind::String)
        error(e.line, "." + name + "() needs a string argument, not a " + type_name(a[i]));
      return a[i].string;
    };
    if (object.kind == Value::Kind::String) {
      const std::string& text = object.string;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        want_args(0, 1);
        const bool given = !a.empty() && a[0].kind != Value::Kind::None;
        return Value::of(
            strip(text, given ? &string_arg(0) : nullptr, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower") {
        want_args(0, 0);
        return Value::of(change_case(text, name == "upper", e.line));
      }
      if (name == "startswith" || name == "endswith") {
        want_args(1, 1);
        std::vector<std::string> candidates;
        if (a[0].kind == Value::Kind::List) {
          for (const Value& item : *a[0].list) {
            if (item.kind != Value::Kind::String) error(e.line, name + "() needs strings");
            candidates.push_back(item.string);
          }
        } else {
          candidates.push_back(string_arg(0));
        }
        return Value::of(std::any_of(candidates.begin(), candidates.end(), [&](const auto& c) {
          return text.size() >= c.size() &&
                 text.compare(name == "startswith" ? 0 : text.size() - c.size(), c.size(), c) == 0;
        }));
      }
      if (name == "split") {
        want_args(0, 1);
        List parts;
        if (a.empty() || a[0].kind == Value::Kind::None) {
          std::string part;
          for (const std::string& point : code_points(text)) {
            const Utf8CodePoint decoded = decode_utf8_at(point, 0);
            if (decoded.valid && is_python_space(decoded.code_point)) {
              if (!part.empty()) parts.push_back(Value::of(std::move(part)));
              part.clear();
            } else {
              part += point;
            }
          }
          if (!part.empty()) parts.push_back(Value::of(std::move(part)));
          return Value::of(std::move(parts));
        }
        const std::string& separator = string_arg(0);
        if (separator.empty()) error(e.line, ".split() got an empty separator");
        size_t begin = 0;
        for (size_t at; (at = text.find(separator, begin)) != std::string::npos;
             begin = at + separator.size())
          parts.push_back(Value::of(text.substr(begin, at - begin)));
        parts.push_back(Value::of(text.substr(begin)));
        return Value::of(std::move(parts));
      }
      if (name == "replace") {
        want_args(2, 2);
        const std::string &from = string_arg(0), &to = string_arg(1);
        if (from.empty()) error(e.line, ".replace() with an empty pattern is not supported");
        std::string out;
        size_t begin = 0;
        for (size_t at; (at = text.find(from, begin)) != std::string::npos;
             begin = at + from.size())
          out += text.substr(begin, at - begin) + to;
        return Value::of(out + text.substr(begin));
      }
    }
    if (object.kind == Value::Kind::Dict) {
      if (name == "get") {
        want_args(1, 2);
        const Value* found = a[0].kind == Value::Kind::String ? object.find(a[0].string) : nullptr;
        if (found) return *found;
        return a.size() == 2 ? a[1] : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        want_args(0, 0);
        List out;
        for (const auto& [key, item] : *object.dict) {
          if (name == "items") out.push_back(Value::of(List{Value::of(key), item}));
          if (name == "keys") out.push_back(Value::of(key));
          if (name == "values") out.push_back(item);
        }
        return Value::of(std::move(out));
      }
    }
    error(e.line, "a " + type_name(object) + " has no method ." + name + "() here");
  }

  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
};

}  // namespace

std::string render(const Template& tmpl,
                   const std::vector<std::pair<std::string, Value>>& globals) {
  return Renderer(globals).run(tmpl.nodes);
}

}  // namespace layup::jinja
