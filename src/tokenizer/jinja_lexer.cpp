// The Jinja lexer (jinja_lexer.h), written to match jinja2's Lexer with trim_blocks and
// lstrip_blocks on: newlines are normalised to "\n" and one trailing newline is dropped; "{%-"
// strips the whitespace before a tag, "-%}" the whitespace after it; a statement or comment tag
// eats the one newline after it; a statement or comment tag alone on its line after spaces takes
// the spaces away ("{%+" keeps them, "+%}" keeps the newline).
#include "tokenizer/jinja_lexer.h"

#include <cctype>
#include <string_view>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace layup::jinja {

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

// The byte length of the whitespace run that ends the text (what Python's rstrip() removes).
size_t trailing_space_bytes(std::string_view text) {
  // Walk forwards (UTF-8 cannot be decoded backwards safely), remembering where the last
  // non-space code point ends.
  size_t last_end = 0;
  for (size_t i = 0; i < text.size();) {
    const Utf8CodePoint point = decode_utf8_at(text, i);
    i += point.byte_count;
    if (!point.valid || !is_python_space(point.code_point)) last_end = i;
  }
  return text.size() - last_end;
}

// The byte length of the whitespace run that starts at `begin` (regex \s*).
size_t leading_space_bytes(std::string_view text, size_t begin) {
  size_t i = begin;
  while (i < text.size()) {
    const Utf8CodePoint point = decode_utf8_at(text, i);
    if (!point.valid || !is_python_space(point.code_point)) break;
    i += point.byte_count;
  }
  return i - begin;
}

bool all_space(std::string_view text) {
  return trailing_space_bytes(text) == text.size();
}

int count_lines(std::string_view text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

// "\r\n" and "\r" become "\n"; one final newline is dropped (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& source) {
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      text += '\n';
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal's body decoded as jinja2 decodes it: Python's "unicode-escape" codec, in which
// an unknown escape keeps its backslash.
std::string decode_string(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\') {
      out += body[i];
      continue;
    }
    LAYUP_CHECK(i + 1 < body.size(), "chat template line ", line, ": a string ends in a backslash");
    const char e = body[++i];
    const auto hex_escape = [&](int digits) {
      LAYUP_CHECK(i + digits < body.size(), "chat template line ", line, ": a \\", e,
                  " escape is cut short");
      char32_t value = 0;
      for (int d = 1; d <= digits; ++d) {
        const int v = hex_value(body[i + d]);
        LAYUP_CHECK(v >= 0, "chat template line ", line, ": a \\", e, " escape needs ", digits,
                    " hex digits");
        value = value * 16 + v;
      }
      LAYUP_CHECK(value <= 0x10FFFF && (value < 0xD800 || value > 0xDFFF), "chat template line ",
                  line, ": a \\", e, " escape names no character");
      i += digits;
      append_utf8(out, value);
    };
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
        hex_escape(2);
        break;
      case 'u':
        hex_escape(4);
        break;
      case 'U':
        hex_escape(8);
        break;
      case 'N':
        fail("chat template line ", line, ": \\N{...} escapes are not supported");
      default:
        if (e >= '0' && e <= '7') {
          char32_t value = e - '0';
          for (int d = 0; d < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++d)
            value = value * 8 + (body[++i] - '0');
          append_utf8(out, value);
        } else {
          // jinja2 turns non-ASCII characters into escapes before decoding, so a backslash before
          // one would not come back as written: refused rather than guessed.
          LAYUP_CHECK(static_cast<unsigned char>(e) < 0x80, "chat template line ", line,
                      ": a backslash before a non-ASCII character is not supported");
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

class Lexer {
 public:
  explicit Lexer(std::string source) : source_(normalize_newlines(source)) {}

  std::vector<Segment> run() {
    while (position_ < source_.size()) {
      const size_t open = find_tag_open(position_);
      std::string_view text(source_.data() + position_, open - position_);
      if (open == source_.size()) {
        add_text(text);
        break;
      }
      const char kind = source_[open + 1];  // '{', '%' or '#'
      const char sign = open + 2 < source_.size() ? source_[open + 2] : '\0';
      if (sign == '-') {
        text.remove_suffix(trailing_space_bytes(text));
      } else if (sign != '+' && kind != '{') {
        const size_t line_begin =
            text.rfind('\n') == std::string_view::npos ? 0 : text.rfind('\n') + 1;
        if ((line_begin > 0 || line_starting_) && line_begin < text.size() &&
            all_space(text.substr(line_begin)))
          text = text.substr(0, line_begin);
      }
      add_text(text);
      line_ += count_lines(std::string_view(source_.data() + position_, open - position_));
      position_ = open + 2 + (sign == '-' || sign == '+');
      if (kind == '#') {
        skip_comment();
      } else {
        read_tag(kind == '{' ? Segment::Type::Output : Segment::Type::Statement);
      }
    }
    return std::move(segments_);
  }

 private:
  size_t find_tag_open(size_t from) const {
    for (size_t i = from; i + 1 < source_.size(); ++i) {
      if (source_[i] == '{' &&
          (source_[i + 1] == '{' || source_[i + 1] == '%' || source_[i + 1] == '#'))
        return i;
    }
    return source_.size();
  }

  void add_text(std::string_view text) {
    if (text.empty()) return;
    segments_.push_back({Segment::Type::Text, std::string(text), {}, line_});
  }

  // Called with position_ just past a tag's "}}", "%}" or "#}": "-" before it eats the
  // whitespace after, a statement or comment without "+" eats one newline (trim_blocks).
  void finish_tag(char sign, bool is_block) {
    if (sign == '-') {
      const size_t eaten = leading_space_bytes(source_, position_);
      line_ += count_lines(std::string_view(source_.data() + position_, eaten));
      position_ += eaten;
    } else if (sign != '+' && is_block && position_ < source_.size() &&
               source_[position_] == '\n') {
      ++line_;
      ++position_;
    }
    line_starting_ = position_ > 0 && source_[position_ - 1] == '\n';
  }

  void skip_comment() {
    const int start_line = line_;
    const size_t close = source_.find("#}", position_);
    LAYUP_CHECK(close != std::string::npos, "chat template line ", start_line,
                ": a comment {# is never closed");
    char sign = '\0';
    if (close > position_ && (source_[close - 1] == '-' || source_[close - 1] == '+'))
      sign = source_[close - 1];
    line_ += count_lines(std::string_view(source_.data() + position_, close - position_));
    position_ = close + 2;
    finish_tag(sign, true);
  }

  void read_tag(Segment::Type type) {
    const char close = type == Segment::Type::Output ? '}' : '%';
    Segment segment{type, {}, {}, line_};
    int depth = 0;  // brackets open: a "}}" inside {...} is not the tag's end
    for (;;) {
      LAYUP_CHECK(position_ < source_.size(), "chat template line ", segment.line, ": a ",
                  type == Segment::Type::Output ? "{{" : "{%", " tag is never closed");
      const char c = source_[position_];
      const auto closes_at = [&](size_t at) {
        return at + 1 < source_.size() && source_[at] == close && source_[at + 1] == '}';
      };
      // "+}}" is no end: jinja2 has no "+" before "}}", so the "+" is an operator there.
      const bool sign_closes = c == '-' || (c == '+' && type == Segment::Type::Statement);
      if (depth == 0 && sign_closes && closes_at(position_ + 1)) {
        position_ += 3;
        finish_tag(c, type == Segment::Type::Statement);
        break;
      }
      if (depth == 0 && closes_at(position_)) {
        position_ += 2;
        finish_tag('\0', type == Segment::Type::Statement);
        break;
      }
      if (std::isspace(static_cast<unsigned char>(c))) {
        line_ += c == '\n';
        ++position_;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t end = position_;
        while (end < source_.size() &&
               (std::isdigit(static_cast<unsigned char>(source_[end])) || source_[end] == '_'))
          ++end;
        const auto digit_at = [&](size_t at) {
          return at < source_.size() && std::isdigit(static_cast<unsigned char>(source_[at]));
        };
        const bool is_float =
            end < source_.size() &&
            ((source_[end] == '.' && digit_at(end + 1)) ||
             ((source_[end] == 'e' || source_[end] == 'E') &&
              (digit_at(end + 1) || source_[end + 1] == '+' || source_[end + 1] == '-')));
        LAYUP_CHECK(!is_float, "chat template line ", line_, ": float numbers are not supported");
        std::string digits;
        for (size_t i = position_; i < end; ++i)
          if (source_[i] != '_') digits += source_[i];
        segment.tokens.push_back({Token::Type::Integer, digits, line_});
        position_ = end;
      } else if (is_name_start(c)) {
        size_t end = position_;
        while (end < source_.size() && is_name_char(source_[end])) ++end;
        segment.tokens.push_back(
            {Token::Type::Name, source_.substr(position_, end - position_), line_});
        position_ = end;
      } else if (c == '\'' || c == '"') {
        size_t end = position_ + 1;
        while (end < source_.size() && source_[end] != c) end += source_[end] == '\\' ? 2 : 1;
        LAYUP_CHECK(end < source_.size(), "chat template line ", line_,
                    ": a string is never closed");
        const std::string_view body(source_.data() + position_ + 1, end - position_ - 1);
        segment.tokens.push_back({Token::Type::String, decode_string(body, line_), line_});
        line_ += count_lines(body);
        position_ = end + 1;
      } else {
        static constexpr const char* kOperators[] = {
            "//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
            "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* candidate : kOperators) {
          if (source_.compare(position_, std::char_traits<char>::length(candidate), candidate) ==
              0) {
            op = candidate;
            break;
          }
        }
        LAYUP_CHECK(!op.empty(), "chat template line ", line_, ": unexpected character '", c,
                    "' in a tag");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          LAYUP_CHECK(depth > 0, "chat template line ", line_, ": unexpected '", op, "'");
          --depth;
        }
        segment.tokens.push_back({Token::Type::Operator, op, line_});
        position_ += op.size();
      }
    }
    if (type == Segment::Type::Statement && !segment.tokens.empty() &&
        segment.tokens[0].type == Token::Type::Name && segment.tokens[0].text == "raw")
      fail("chat template line ", segment.line, ": {% raw %} blocks are not supported");
    segments_.push_back(std::move(segment));
  }

  std::string source_;
  size_t position_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Segment> segments_;
};

}  // namespace

std::vector<Segment> lex_template(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace layup::jinja
