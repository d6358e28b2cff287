// How every flag of every command is declared: its type, the values it admits and how --help and
// docs/cli.md write them, once. The text the user typed is checked where it enters, and a value
// out of range is refused in one line that echoes it as written.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace layup {

// The whole numbers a flag admits. `shown` is what --help prints between < > and what
// docs/cli.md's value column says ("integer ≥ 1", "0 .. 3"); a bound that depends on another
// flag ("1 .. --steps") is shown here and checked once both are known.
struct WholeRange {
  int64_t min = 0;
  uint64_t max = std::numeric_limits<uint64_t>::max();  // also capped by the value's type
  std::string shown;
  std::string note;  // said with a refusal: what a bound known only here is ("... 16 cores")
};
WholeRange at_least(int64_t min);                          // "integer ≥ MIN"
WholeRange from_to(int64_t min, uint64_t max);             // "MIN .. MAX"
WholeRange shown_as(WholeRange range, std::string shown);  // the same bounds, other words

// The real numbers a flag admits: always finite, and checked after rounding to the type that
// holds them (--beta2 0.9999999999 is 1 in a float, and refused as such).
struct RealRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false, max_open = false;  // > rather than ≥, < rather than ≤
  std::string shown;
};
RealRange positive_real();      // "finite number > 0"
RealRange non_negative_real();  // "finite number ≥ 0"
RealRange real_between(double min, bool min_open, double max, bool max_open, std::string shown);

// The check behind each kind of flag: "" when `text` is admitted, else the refusal after the
// flag's name ("must be an integer ≥ 1 (got '0')"). Public for the tests.
template <class Int>
std::string check_whole(const std::string& text, const WholeRange& range);
template <class Real>
std::string check_real(const std::string& text, const RealRange& range);
// A file or folder's name as a flag takes it: not empty, and not a word that starts with '-'
// (`--out --overwrite` would make a folder named --overwrite: such a name is written ./-name).
std::string check_path(const std::string& text);

// The check of one whole number, for a list flag (each value is checked).
template <class Int>
CLI::Validator whole_validator(const WholeRange& range) {
  return CLI::Validator([range](std::string& text) { return check_whole<Int>(text, range); }, "");
}

template <class Int>
CLI::Option* add_whole_flag(CLI::App& command, const std::string& flag, Int& value,
                            const WholeRange& range, const std::string& description) {
  static_assert(std::is_integral_v<Int>);
  return command.add_option(flag, value, description)
      ->check(whole_validator<Int>(range))
      ->type_name(range.shown);
}

template <class Real>
CLI::Option* add_real_flag(CLI::App& command, const std::string& flag, Real& value,
                           const RealRange& range, const std::string& description) {
  static_assert(std::is_floating_point_v<Real>);
  return command.add_option(flag, value, description)
      ->check(
          CLI::Validator([range](std::string& text) { return check_real<Real>(text, range); }, ""))
      ->type_name(range.shown);
}

// A file or folder (`what`: "file", "folder", "file or folder", ...), not empty.
CLI::Option* add_path_flag(CLI::App& command, const std::string& flag, std::string& value,
                           const std::string& what, const std::string& description);
// Files or folders, each checked as above (a positional list).
CLI::Option* add_path_flag(CLI::App& command, const std::string& flag,
                           std::vector<std::string>& values, const std::string& what,
                           const std::string& description);
// Free text (a prompt): any text, the empty one included.
CLI::Option* add_text_flag(CLI::App& command, const std::string& flag, std::string& value,
                           const std::string& what, const std::string& description);
// The check of add_parsed_flag: `parse`'s message when it throws.
CLI::Validator parsed_validator(void (*parse)(const std::string& text));

// A value checked by `parse`, which throws layup::Error naming the flag when the text is not one
// it takes (a size, a placement): run once here to refuse the text before any work, and again
// where the value is used.
template <class Value>  // std::string, or std::vector<std::string> for a list
CLI::Option* add_parsed_flag(CLI::App& command, const std::string& flag, Value& value,
                             const std::string& shown, void (*parse)(const std::string& text),
                             const std::string& description) {
  return command.add_option(flag, value, description)
      ->check(parsed_validator(parse))
      ->type_name(shown);
}

// --help's option rows as "--batch <integer ≥ 1> [default: 8]": what docs/cli.md's tables hold,
// so tests/oracle/test_docs.py can compare them.
class LayupHelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* option) const override;
  std::string make_option(const CLI::Option* option, bool is_positional) const override;
};

// A failed parse as layup's one line: the flag, the value as written and the range, or the
// nearest subcommand or flag to a mistyped one.
std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error);
// Before parsing: a first argument that is neither a subcommand nor one of layup's own flags,
// said with the nearest one; "" when there is none to complain of.
std::string unknown_subcommand(const CLI::App& app, int argc, const char* const* argv);
// The name among `candidates` nearest to `typed` (edit distance), or "" when none is near.
std::string nearest_name(const std::string& typed, const std::vector<std::string>& candidates);

}  // namespace layup
