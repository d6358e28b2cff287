// The first pass over a Jinja template: text, {{ output }} and {% statement %} segments, the
// whitespace control of jinja2 (with transformers' trim_blocks and lstrip_blocks) applied, and
// each tag's expression cut into tokens. Comments are dropped here.
#pragma once

#include <string>
#include <vector>

namespace layup::jinja {

struct Token {
  enum class Type { Name, String, Integer, Operator };
  Type type;
  std::string text;  // a String's decoded value; an Operator's spelling ("==", "[")
  int line = 1;
};

struct Segment {
  enum class Type { Text, Output, Statement };
  Type type;
  std::string text;           // Text
  std::vector<Token> tokens;  // Output, Statement
  int line = 1;
};

// Throws layup::Error naming the line for an unclosed tag, a float literal, a raw block or a
// character no Jinja token starts with.
std::vector<Segment> lex_template(const std::string& source);

// Python's str.isspace for one code point (what jinja2's strip and str.strip() remove).
bool is_python_space(char32_t code_point);

}  // namespace layup::jinja
