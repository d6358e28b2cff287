// The chat template parser (jinja_parser.h): jinja2's grammar for the subset, refusing the rest.
#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"
#include "tokenizer/jinja_lexer.h"

namespace layup::jinja {
namespace {

const std::vector<std::string> kFilters = {
    "trim", "length", "count",  "upper",   "lower", "tojson", "items",  "join",       "first",
    "last", "list",   "string", "default", "d",     "select", "reject", "selectattr", "rejectattr"};
const std::vector<std::string> kTests = {
    "defined",  "undefined", "none",  "string",  "number", "integer", "boolean", "mapping",
    "iterable", "true",      "false", "equalto", "eq",     "ne",      "odd",     "even"};
const std::vector<std::string> kFunctions = {"raise_exception", "namespace", "range",
                                             "strftime_now"};
const std::vector<std::string> kMethods = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                           "split", "upper",  "lower",  "replace",    "get",
                                           "items", "keys",   "values"};

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// The tokens of one tag, read front to back.
class Tokens {
 public:
  Tokens(const std::vector<Token>& tokens, int line) : tokens_(tokens), line_(line) {}

  bool done() const { return position_ == tokens_.size(); }
  int line() const {
    return done() ? (tokens_.empty() ? line_ : tokens_.back().line) : peek().line;
  }
  const Token& peek(size_t ahead = 0) const {
    static const Token kEnd{Token::Type::Operator, "end of tag", 0};
    return position_ + ahead < tokens_.size() ? tokens_[position_ + ahead] : kEnd;
  }
  bool at_op(const char* op, size_t ahead = 0) const {
    const Token& token = peek(ahead);
    return position_ + ahead < tokens_.size() && token.type == Token::Type::Operator &&
           token.text == op;
  }
  bool at_name(const char* name, size_t ahead = 0) const {
    const Token& token = peek(ahead);
    return position_ + ahead < tokens_.size() && token.type == Token::Type::Name &&
           token.text == name;
  }
  Token next() {
    LAYUP_CHECK(!done(), "chat template line ", line(), ": a tag ends too early");
    return tokens_[position_++];
  }
  bool skip_op(const char* op) {
    if (!at_op(op)) return false;
    ++position_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!at_name(name)) return false;
    ++position_;
    return true;
  }
  void expect_op(const char* op) {
    LAYUP_CHECK(at_op(op), "chat template line ", line(), ": expected '", op, "', found '",
                peek().text, "'");
    ++position_;
  }
  std::string expect_name() {
    LAYUP_CHECK(!done() && peek().type == Token::Type::Name, "chat template line ", line(),
                ": expected a name, found '", peek().text, "'");
    return tokens_[position_++].text;
  }
  void expect_done() {
    LAYUP_CHECK(done(), "chat template line ", line(), ": unexpected '", peek().text,
                "' at the end of a tag");
  }

 private:
  const std::vector<Token>& tokens_;
  size_t position_ = 0;
  int line_;
};

using ExprPtr = std::unique_ptr<Expr>;

Node make_node(Node::Type type, int line, std::string text = {}) {
  Node node;
  node.type = type;
  node.line = line;
  node.text = std::move(text);
  return node;
}

ExprPtr make(Expr::Type type, int line, std::string name = {}) {
  auto expr = std::make_unique<Expr>();
  expr->type = type;
  expr->line = line;
  expr->name = std::move(name);
  return expr;
}

ExprPtr make(Expr::Type type, int line, std::string name, ExprPtr a, ExprPtr b = nullptr) {
  ExprPtr expr = make(type, line, std::move(name));
  expr->args.push_back(std::move(a));
  if (b) expr->args.push_back(std::move(b));
  return expr;
}

// Expressions, one function per precedence level, as jinja2's Parser has them.
class ExprParser {
 public:
  explicit ExprParser(Tokens& tokens) : t_(tokens) {}

  // An expression, or a tuple of them "a, b" (a List).
  ExprPtr tuple(bool with_conditional = true) {
    const int line = t_.line();
    ExprPtr first = expression(with_conditional);
    if (!t_.at_op(",")) return first;
    ExprPtr items = make(Expr::Type::List, line);
    items->args.push_back(std::move(first));
    while (t_.skip_op(",")) {
      if (t_.done()) break;
      items->args.push_back(expression(with_conditional));
    }
    return items;
  }

  ExprPtr expression(bool with_conditional = true) {
    ExprPtr value = or_expr();
    if (!with_conditional) return value;
    while (t_.at_name("if")) {
      const int line = t_.next().line;
      ExprPtr condition = or_expr();
      ExprPtr otherwise = t_.skip_name("else") ? expression() : nullptr;
      ExprPtr node =
          make(Expr::Type::Conditional, line, "", std::move(value), std::move(condition));
      node->args.push_back(std::move(otherwise));
      value = std::move(node);
    }
    return value;
  }

 private:
  ExprPtr or_expr() {
    ExprPtr left = and_expr();
    while (t_.at_name("or")) {
      const int line = t_.next().line;
      left = make(Expr::Type::Binary, line, "or", std::move(left), and_expr());
    }
    return left;
  }

  ExprPtr and_expr() {
    ExprPtr left = not_expr();
    while (t_.at_name("and")) {
      const int line = t_.next().line;
      left = make(Expr::Type::Binary, line, "and", std::move(left), not_expr());
    }
    return left;
  }

  ExprPtr not_expr() {
    if (t_.at_name("not")) {
      const int line = t_.next().line;
      return make(Expr::Type::Not, line, "", not_expr());
    }
    return compare();
  }

  ExprPtr compare() {
    const int line = t_.line();
    ExprPtr first = math1();
    ExprPtr node;
    for (;;) {
      std::string op;
      for (const char* candidate : {"==", "!=", "<", ">", "<=", ">="})
        if (t_.at_op(candidate)) op = candidate;
      if (!op.empty()) {
        t_.next();
      } else if (t_.at_name("in")) {
        t_.next();
        op = "in";
      } else if (t_.at_name("not") && t_.at_name("in", 1)) {
        t_.next();
        t_.next();
        op = "not in";
      } else {
        break;
      }
      if (!node) {
        node = make(Expr::Type::Compare, line);
        node->args.push_back(std::move(first));
      }
      node->ops.push_back(op);
      node->args.push_back(math1());
    }
    return node ? std::move(node) : std::move(first);
  }

  ExprPtr math1() {
    ExprPtr left = concat();
    while (t_.at_op("+") || t_.at_op("-")) {
      const Token op = t_.next();
      left = make(Expr::Type::Binary, op.line, op.text, std::move(left), concat());
    }
    return left;
  }

  ExprPtr concat() {
    ExprPtr left = math2();
    while (t_.at_op("~")) {
      const int line = t_.next().line;
      left = make(Expr::Type::Binary, line, "~", std::move(left), math2());
    }
    return left;
  }

  ExprPtr math2() {
    ExprPtr left = unary(true);
    for (;;) {
      LAYUP_CHECK(!t_.at_op("/"), "chat template line ", t_.line(),
                  ": '/' (division to a float) is not supported; use '//'");
      LAYUP_CHECK(!t_.at_op("**"), "chat template line ", t_.line(), ": '**' is not supported");
      if (!(t_.at_op("*") || t_.at_op("//") || t_.at_op("%"))) return left;
      const Token op = t_.next();
      left = make(Expr::Type::Binary, op.line, op.text, std::move(left), unary(true));
    }
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr node;
    if (t_.at_op("-")) {
      const int line = t_.next().line;
      node = make(Expr::Type::Negate, line, "", unary(false));
    } else {
      LAYUP_CHECK(!t_.at_op("+"), "chat template line ", t_.line(), ": unary '+' is not supported");
      node = primary();
    }
    node = postfix(std::move(node));
    if (with_filter) node = filters(std::move(node));
    return node;
  }

  ExprPtr primary() {
    const Token token = t_.next();
    switch (token.type) {
      case Token::Type::Name: {
        ExprPtr node = make(Expr::Type::Literal, token.line);
        if (token.text == "true" || token.text == "True") {
          node->value = Value::of(true);
        } else if (token.text == "false" || token.text == "False") {
          node->value = Value::of(false);
        } else if (token.text == "none" || token.text == "None") {
          node->value = Value::none();
        } else {
          node = make(Expr::Type::Name, token.line, token.text);
        }
        return node;
      }
      case Token::Type::String: {
        std::string text = token.text;
        while (!t_.done() && t_.peek().type == Token::Type::String) text += t_.next().text;
        ExprPtr node = make(Expr::Type::Literal, token.line);
        node->value = Value::of(std::move(text));
        return node;
      }
      case Token::Type::Integer: {
        errno = 0;
        const long long value = std::strtoll(token.text.c_str(), nullptr, 10);
        LAYUP_CHECK(errno == 0, "chat template line ", token.line, ": ", token.text,
                    " is too large an integer");
        ExprPtr node = make(Expr::Type::Literal, token.line);
        node->value = Value::of(static_cast<int64_t>(value));
        return node;
      }
      case Token::Type::Operator:
        break;
    }
    if (token.text == "(") {
      if (t_.skip_op(")")) return make(Expr::Type::List, token.line);
      ExprPtr inner = tuple();
      t_.expect_op(")");
      return inner;
    }
    if (token.text == "[") {
      ExprPtr items = make(Expr::Type::List, token.line);
      while (!t_.skip_op("]")) {
        if (!items->args.empty()) t_.expect_op(",");
        if (t_.skip_op("]")) break;
        items->args.push_back(expression());
      }
      return items;
    }
    if (token.text == "{") {
      ExprPtr dict = make(Expr::Type::DictLiteral, token.line);
      while (!t_.skip_op("}")) {
        if (!dict->args.empty()) t_.expect_op(",");
        if (t_.skip_op("}")) break;
        dict->args.push_back(expression());
        t_.expect_op(":");
        dict->args.push_back(expression());
      }
      return dict;
    }
    fail("chat template line ", token.line, ": unexpected '", token.text, "'");
  }

  ExprPtr postfix(ExprPtr node) {
    for (;;) {
      if (t_.at_op(".")) {
        const int line = t_.next().line;
        const Token key = t_.next();
        if (key.type == Token::Type::Integer) {
          ExprPtr index = make(Expr::Type::Literal, line);
          index->value =
              Value::of(static_cast<int64_t>(std::strtoll(key.text.c_str(), nullptr, 10)));
          node = make(Expr::Type::Subscript, line, "", std::move(node), std::move(index));
        } else {
          LAYUP_CHECK(key.type == Token::Type::Name, "chat template line ", line,
                      ": expected a name after '.'");
          node = make(Expr::Type::Attribute, line, key.text, std::move(node));
        }
      } else if (t_.at_op("[")) {
        node = subscript(std::move(node));
      } else if (t_.at_op("(")) {
        node = call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr subscript(ExprPtr node) {
    const int line = t_.next().line;
    ExprPtr parts[3];
    bool is_slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!t_.at_op(":") && !t_.at_op("]")) parts[part] = expression();
      if (part < 2 && t_.skip_op(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    t_.expect_op("]");
    if (!is_slice) {
      LAYUP_CHECK(parts[0] != nullptr, "chat template line ", line, ": an empty subscript []");
      return make(Expr::Type::Subscript, line, "", std::move(node), std::move(parts[0]));
    }
    ExprPtr slice = make(Expr::Type::Slice, line);
    slice->args.push_back(std::move(node));
    for (ExprPtr& part : parts) slice->args.push_back(std::move(part));
    return slice;
  }

  // "(a, b, key=c)" into node's args (after those it has) and kwargs.
  void arguments(Expr& node) {
    t_.expect_op("(");
    bool first = true;
    while (!t_.skip_op(")")) {
      if (!first) t_.expect_op(",");
      first = false;
      if (t_.skip_op(")")) break;
      LAYUP_CHECK(!t_.at_op("*") && !t_.at_op("**"), "chat template line ", t_.line(),
                  ": *args and **kwargs are not supported");
      if (!t_.done() && t_.peek().type == Token::Type::Name && t_.at_op("=", 1)) {
        std::string key = t_.next().text;
        t_.next();
        node.kwargs.emplace_back(std::move(key), expression());
      } else {
        LAYUP_CHECK(node.kwargs.empty(), "chat template line ", t_.line(),
                    ": a positional argument after a keyword argument");
        node.args.push_back(expression());
      }
    }
  }

  ExprPtr call(ExprPtr callee) {
    const int line = t_.line();
    if (callee->type == Expr::Type::Attribute) {
      LAYUP_CHECK(contains(kMethods, callee->name), "chat template line ", line, ": the method ",
                  callee->name, "() is not supported (supported: ", list_names(kMethods), ")");
    } else {
      LAYUP_CHECK(callee->type == Expr::Type::Name, "chat template line ", line,
                  ": only functions and methods can be called");
      LAYUP_CHECK(contains(kFunctions, callee->name), "chat template line ", line,
                  ": the function ", callee->name,
                  "() is not supported (supported: ", list_names(kFunctions), ")");
    }
    ExprPtr node = make(Expr::Type::Call, line, "", std::move(callee));
    arguments(*node);
    return node;
  }

  ExprPtr filters(ExprPtr node) {
    for (;;) {
      if (t_.at_op("|")) {
        const int line = t_.next().line;
        const std::string name = t_.expect_name();
        LAYUP_CHECK(!t_.at_op("."), "chat template line ", line,
                    ": dotted filter names are not supported");
        LAYUP_CHECK(contains(kFilters, name), "chat template line ", line, ": the filter '", name,
                    "' is not supported (supported: ", list_names(kFilters), ")");
        node = make(Expr::Type::Filter, line, name, std::move(node));
        if (t_.at_op("(")) arguments(*node);
      } else if (t_.at_name("is")) {
        const int line = t_.next().line;
        const bool negated = t_.skip_name("not");
        const std::string name = t_.expect_name();
        LAYUP_CHECK(contains(kTests, name), "chat template line ", line, ": the test '", name,
                    "' is not supported (supported: ", list_names(kTests), ")");
        node = make(Expr::Type::Test, line, name, std::move(node));
        node->negated = negated;
        if (t_.at_op("(")) {
          arguments(*node);
        } else {
          const Token& after = t_.peek();
          const bool starts_argument =
              !t_.done() &&
              (after.type == Token::Type::String || after.type == Token::Type::Integer ||
               (after.type == Token::Type::Name && after.text != "else" && after.text != "or" &&
                after.text != "and") ||
               after.text == "[" || after.text == "{");
          LAYUP_CHECK(!starts_argument, "chat template line ", line,
                      ": a test's argument without parentheses is not supported");
        }
        LAYUP_CHECK(node->kwargs.empty(), "chat template line ", line,
                    ": keyword arguments to a test are not supported");
      } else if (t_.at_op("(")) {
        node = call(std::move(node));
      } else {
        return node;
      }
    }
  }

  Tokens& t_;
};

// Statements, over the lexer's segments.
class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Template run() {
    Template result;
    const std::string end = body(result.nodes, {});
    LAYUP_CHECK(end.empty(), "chat template line ", line_, ": unexpected {% ", end, " %}");
    return result;
  }

 private:
  // Parses nodes into `out` up to one of the end tags, whose name it returns with the tag's
  // tokens left in `end_tokens_` ("" at the end of the template).
  std::string body(std::vector<Node>& out, std::initializer_list<const char*> ends) {
    while (index_ < segments_.size()) {
      const Segment& segment = segments_[index_++];
      line_ = segment.line;
      if (segment.type == Segment::Type::Text) {
        out.push_back(make_node(Node::Type::Text, segment.line, segment.text));
        continue;
      }
      Tokens tokens(segment.tokens, segment.line);
      if (segment.type == Segment::Type::Output) {
        Node node = make_node(Node::Type::Output, segment.line);
        node.expr = ExprParser(tokens).tuple();
        tokens.expect_done();
        out.push_back(std::move(node));
        continue;
      }
      const std::string tag = tokens.expect_name();
      for (const char* end : ends) {
        if (tag == end) {
          end_segment_ = &segment;
          return tag;
        }
      }
      out.push_back(statement(tag, tokens, segment.line));
    }
    LAYUP_CHECK(ends.size() == 0, "chat template: a {% ", open_tags_.back(),
                " %} block is never closed");
    return "";
  }

  Node statement(const std::string& tag, Tokens& tokens, int line) {
    Node node = make_node(Node::Type::Text, line);
    if (tag == "if") {
      node.type = Node::Type::If;
      ExprPtr condition = ExprParser(tokens).tuple(false);
      tokens.expect_done();
      open_tags_.push_back("if");
      for (;;) {
        std::vector<Node> branch;
        const std::string end = body(branch, {"elif", "else", "endif"});
        node.branches.emplace_back(std::move(condition), std::move(branch));
        Tokens end_tokens(end_segment_->tokens, end_segment_->line);
        end_tokens.next();
        if (end == "endif") {
          end_tokens.expect_done();
          break;
        }
        if (end == "elif") {
          condition = ExprParser(end_tokens).tuple(false);
          end_tokens.expect_done();
          continue;
        }
        end_tokens.expect_done();
        std::vector<Node> else_branch;
        const std::string last = body(else_branch, {"endif"});
        (void)last;
        node.branches.emplace_back(nullptr, std::move(else_branch));
        break;
      }
      open_tags_.pop_back();
    } else if (tag == "for") {
      node.type = Node::Type::For;
      do {
        node.targets.push_back(tokens.expect_name());
      } while (tokens.skip_op(","));
      LAYUP_CHECK(tokens.skip_name("in"), "chat template line ", line, ": expected 'in' in a for");
      ExprParser expressions(tokens);
      node.expr = expressions.tuple(false);
      if (tokens.skip_name("if")) node.filter = expressions.expression(false);
      LAYUP_CHECK(!tokens.at_name("recursive"), "chat template line ", line,
                  ": recursive loops are not supported");
      tokens.expect_done();
      open_tags_.push_back("for");
      ++loop_depth_;
      std::string end = body(node.body, {"else", "endfor"});
      --loop_depth_;
      if (end == "else") end = body(node.else_body, {"endfor"});
      open_tags_.pop_back();
    } else if (tag == "set") {
      const std::string name = tokens.expect_name();
      node.targets.push_back(name);
      node.type = Node::Type::Set;
      if (tokens.skip_op(".")) {
        node.type = Node::Type::SetAttribute;
        node.targets.push_back(tokens.expect_name());
      }
      LAYUP_CHECK(!tokens.at_op(","), "chat template line ", line,
                  ": setting several names at once is not supported");
      LAYUP_CHECK(tokens.skip_op("="), "chat template line ", line,
                  ": block {% set %}...{% endset %} is not supported");
      node.expr = ExprParser(tokens).tuple();
      tokens.expect_done();
    } else if (tag == "break" || tag == "continue") {
      LAYUP_CHECK(loop_depth_ > 0, "chat template line ", line, ": ", tag, " outside a loop");
      node.type = tag == "break" ? Node::Type::Break : Node::Type::Continue;
      tokens.expect_done();
    } else if (tag == "generation") {
      // transformers' marker of assistant text: rendered as its body.
      node.type = Node::Type::Block;
      tokens.expect_done();
      open_tags_.push_back("generation");
      body(node.body, {"endgeneration"});
      open_tags_.pop_back();
    } else if (tag == "elif" || tag == "else" || tag.rfind("end", 0) == 0) {
      fail("chat template line ", line, ": unexpected {% ", tag, " %}");
    } else {
      fail("chat template line ", line, ": the tag {% ", tag,
           " %} is not supported (supported: if, elif, else, for, set, break, continue, "
           "generation)");
    }
    if (node.type == Node::Type::For || node.type == Node::Type::Block) {
      Tokens end_tokens(end_segment_->tokens, end_segment_->line);
      end_tokens.next();
      end_tokens.expect_done();
    }
    return node;
  }

  std::vector<Segment> segments_;
  size_t index_ = 0;
  int line_ = 1;
  int loop_depth_ = 0;
  const Segment* end_segment_ = nullptr;
  std::vector<std::string> open_tags_;
};

}  // namespace

Template parse_template(const std::string& source) {
  return Parser(lex_template(source)).run();
}

}  // namespace layup::jinja
