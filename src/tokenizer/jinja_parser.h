// The syntax tree of a chat template and the recursive-descent parser that builds it from the
// lexer's segments, with jinja2's operator precedence (lowest first):
//   a if b else c · or · and · not · == != < > <= >= in, not in · + - · ~ · * // % · unary - ·
//   then a primary with its .attr, [index], [a:b], (call), |filter and "is" test suffixes.
// Statements: if/elif/else, for (with a loop filter and else), set (a name or ns.attribute),
// break, continue, and transformers' generation block. Every other tag, filter, test, global
// function or method is refused here, with its line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace layup::jinja {

struct Expr {
  enum class Type {
    Literal,      // value
    Name,         // name
    List,         // args: the items (a list or a tuple)
    DictLiteral,  // args: key, value, key, value...
    Attribute,    // args[0].name
    Subscript,    // args[0][args[1]]
    Slice,        // args[0][args[1]:args[2]:args[3]], each of the three may be null
    Call,         // args[0](args[1...], kwargs)
    Filter,       // args[0] | name(args[1...], kwargs)
    Test,         // args[0] is [not] name(args[1...])
    Not,          // not args[0]
    Negate,       // -args[0]
    Binary,       // args[0] name args[1]: + - * // % ~ and or
    Compare,      // args[0] ops[0] args[1] ops[1] args[2]...: == != < > <= >= in "not in"
    Conditional,  // args[0] if args[1] else args[2] (null: undefined)
  };
  Type type;
  int line = 1;
  Value value;
  std::string name;
  std::vector<std::string> ops;
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> args;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

struct Node {
  enum class Type { Text, Output, If, For, Set, SetAttribute, Break, Continue, Block };
  Type type;
  int line = 1;
  std::string text;                  // Text
  std::unique_ptr<Expr> expr;        // Output, Set and SetAttribute's value, For's iterable
  std::unique_ptr<Expr> filter;      // For's "if" (null: none)
  std::vector<std::string> targets;  // For's loop names; Set's name; SetAttribute's name, attr
  // If: (condition, body) for if and each elif, then (null, body) for else.
  std::vector<std::pair<std::unique_ptr<Expr>, std::vector<Node>>> branches;
  std::vector<Node> body, else_body;  // For, Block
};

struct Template {
  std::vector<Node> nodes;
};

// Throws layup::Error ("chat template line N: ...") for a syntax error or anything outside the
// subset.
Template parse_template(const std::string& source);

}  // namespace layup::jinja
