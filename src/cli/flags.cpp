// The typed flags of cli/flags.h: each kind's check of the text as typed, the help rows, and
// CLI11's own errors said in layup's one-line form.
#include "cli/flags.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace layup {

WholeRange at_least(int64_t min) {
  return {min, std::numeric_limits<uint64_t>::max(), "integer ≥ " + std::to_string(min), ""};
}

WholeRange from_to(int64_t min, uint64_t max) {
  return {min, max, std::to_string(min) + " .. " + std::to_string(max), ""};
}

WholeRange shown_as(WholeRange range, std::string shown) {
  range.shown = std::move(shown);
  return range;
}

RealRange positive_real() {
  return real_between(0.0, true, INFINITY, false, "finite number > 0");
}

RealRange non_negative_real() {
  return real_between(0.0, false, INFINITY, false, "finite number ≥ 0");
}

RealRange real_between(double min, bool min_open, double max, bool max_open, std::string shown) {
  return {min, max, min_open, max_open, std::move(shown)};
}

namespace {

// "integer ≥ 1" reads "must be an integer ≥ 1"; "0 .. 3" reads "must be 0 .. 3".
std::string as_phrase(const std::string& shown) {
  if (shown.starts_with("integer")) return "an " + shown;
  if (shown.starts_with("finite") || shown.starts_with("number")) return "a " + shown;
  return shown;
}

std::string refusal(const std::string& shown, const std::string& text,
                    const std::string& why = "") {
  return "must be " + as_phrase(shown) + " (got '" + text + "'" + (why.empty() ? "" : ", " + why) +
         ")";
}

template <class Number>
std::string number_text(Number value) {
  std::ostringstream out;
  out.precision(std::numeric_limits<Number>::max_digits10);
  out << value;
  return out.str();
}

}  // namespace

template <class Int>
std::string check_whole(const std::string& text, const WholeRange& range) {
  Int value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range && stop == end)
    return refusal(
        range.shown, text,
        text.starts_with("-")
            ? "below the least this flag holds, " + number_text(std::numeric_limits<Int>::min())
            : "above the most this flag holds, " + number_text(std::numeric_limits<Int>::max()));
  if (text.empty() || error != std::errc() || stop != end) return refusal(range.shown, text);
  if (std::cmp_less(value, range.min) || std::cmp_greater(value, range.max))
    return refusal(range.shown, text, range.note);
  return "";
}

template <class Real>
std::string check_real(const std::string& text, const RealRange& range) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front())))
    return refusal(range.shown, text);
  char* stop = nullptr;
  errno = 0;
  const double parsed = std::strtod(text.c_str(), &stop);
  if (stop != text.c_str() + text.size()) return refusal(range.shown, text);
  if (!std::isfinite(parsed)) return refusal(range.shown, text);
  const Real value = static_cast<Real>(parsed);
  const char* kind = sizeof(Real) == 4 ? "a 32-bit float" : "a 64-bit float";
  if (!std::isfinite(value))
    return refusal(range.shown, text, std::string("beyond the largest ") + kind + " holds");
  const double held = static_cast<double>(value);
  const bool below = range.min_open ? held <= range.min : held < range.min;
  const bool above = range.max_open ? held >= range.max : held > range.max;
  if (!below && !above) return "";
  // The value as first typed may lie inside the range and round out of it.
  return refusal(
      range.shown, text,
      held == parsed ? "" : std::string("which ") + kind + " holds as " + number_text(value));
}

template std::string check_whole<int>(const std::string&, const WholeRange&);
template std::string check_whole<long>(const std::string&, const WholeRange&);
template std::string check_whole<long long>(const std::string&, const WholeRange&);
template std::string check_whole<unsigned long>(const std::string&, const WholeRange&);
template std::string check_whole<unsigned long long>(const std::string&, const WholeRange&);
template std::string check_real<float>(const std::string&, const RealRange&);
template std::string check_real<double>(const std::string&, const RealRange&);

std::string check_path(const std::string& text) {
  if (text.empty()) return "must not be empty (got '')";
  if (text.front() == '-')
    return "takes a name, and '" + text +
           "' reads as a flag: give the name after the flag (one that starts with '-' is written "
           "./" +
           text + ")";
  return "";
}

CLI::Option* add_path_flag(CLI::App& command, const std::string& flag, std::string& value,
                           const std::string& what, const std::string& description) {
  return command.add_option(flag, value, description)
      ->check(CLI::Validator(check_path, ""))
      ->type_name(what);
}

CLI::Option* add_path_flag(CLI::App& command, const std::string& flag,
                           std::vector<std::string>& values, const std::string& what,
                           const std::string& description) {
  return command.add_option(flag, values, description)
      ->check(CLI::Validator(check_path, ""))
      ->type_name(what);
}

CLI::Option* add_text_flag(CLI::App& command, const std::string& flag, std::string& value,
                           const std::string& what, const std::string& description) {
  return command.add_option(flag, value, description)->type_name(what);
}

CLI::Validator parsed_validator(void (*parse)(const std::string& text)) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          parse(text);
          return "";
        } catch (const Error& error) {
          return error.what();
        }
      },
      "");
}

std::string LayupHelpFormatter::make_option_opts(const CLI::Option* option) const {
  if (!option->get_option_text().empty()) return " " + option->get_option_text();
  std::string out;
  if (option->get_type_size() != 0) {
    if (!option->get_type_name().empty()) out += " <" + option->get_type_name() + ">";
    if (option->get_expected_max() > 1) out += " ...";
    if (!option->get_default_str().empty()) out += " [default: " + option->get_default_str() + "]";
  }
  if (!option->get_envname().empty()) out += " (or " + option->get_envname() + ")";
  if (option->get_required()) out += " REQUIRED";
  return out;
}

std::string LayupHelpFormatter::make_option(const CLI::Option* option, bool is_positional) const {
  const std::string left =
      "  " + make_option_name(option, is_positional) + make_option_opts(option);
  // Padded by the characters a terminal shows, not by bytes as CLI11 pads ("≥" is three bytes).
  const size_t shown = static_cast<size_t>(std::count_if(left.begin(), left.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
  const size_t column = get_column_width();
  std::string description;
  for (const char c : make_option_desc(option))  // a second line starts under the first
    description += c == '\n' ? "\n" + std::string(get_column_width(), ' ') : std::string(1, c);
  if (description.empty()) return left + "\n";
  return left +
         (shown < column ? std::string(column - shown, ' ') : "\n" + std::string(column, ' ')) +
         description + "\n";
}

std::string nearest_name(const std::string& typed, const std::vector<std::string>& candidates) {
  // Levenshtein distance, one row at a time.
  const auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = std::max<size_t>(2, typed.size() / 3) + 1;  // farther reads as no match
  for (const std::string& candidate : candidates) {
    const size_t d =
        candidate.starts_with(typed) && typed.size() >= 4 ? 1 : distance(typed, candidate);
    if (d < best_distance) best = candidate, best_distance = d;
  }
  return best;
}

namespace {

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The subcommand the command line chose, or the app itself.
const CLI::App& chosen(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->parsed()) return *sub;
  return app;
}

std::string command_name(const CLI::App& app, const CLI::App& command) {
  return &command == &app ? "layup" : "layup " + command.get_name();
}

// The long and short names of `command`'s flags, with their dashes.
std::vector<std::string> flag_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

// The words after CLI11's "...not expected: " (which joins them with spaces).
std::vector<std::string> unexpected_words(const std::string& message) {
  std::vector<std::string> words;
  const size_t colon = message.find(": ");
  std::istringstream rest(colon == std::string::npos ? "" : message.substr(colon + 2));
  for (std::string word; rest >> word;) words.push_back(word);
  return words;
}

std::string describe_extras(const CLI::App& app, const std::string& message) {
  const CLI::App& command = chosen(app);
  const std::string name = command_name(app, command);
  const std::vector<std::string> words = unexpected_words(message);
  for (const std::string& word : words) {
    if (!word.starts_with("-")) continue;
    const std::string flag = word.substr(0, word.find('='));
    const std::string near = nearest_name(flag, flag_names(command));
    return "`" + name + "` has no flag " + flag +
           (near.empty() ? "" : "; did you mean " + near + "?") + " (`" + name +
           " --help` lists its flags)";
  }
  if (&command == &app && !words.empty()) {
    const std::string near = nearest_name(words.front(), subcommand_names(app));
    return "unknown command '" + words.front() + "'" +
           (near.empty() ? "" : "; did you mean `layup " + near + "`?") +
           " (the commands: " + listed(subcommand_names(app)) + ")";
  }
  return "`" + name + "` takes no argument '" + (words.empty() ? "" : words.front()) +
         "' here: each value goes right after its flag, as in --steps 100 (`" + name +
         " --help` lists the flags)";
}

// CLI11 names an option by its long name with dashes: the option, in the chosen command.
const CLI::Option* option_named(const CLI::App& app, const std::string& name) {
  const CLI::App& command = chosen(app);
  for (const CLI::Option* option : command.get_options())
    if (option->get_name() == name || option->check_name(name)) return option;
  return nullptr;
}

}  // namespace

std::string unknown_subcommand(const CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return "";
  const std::string typed = argv[1];
  if (typed.starts_with("-")) {  // before any command only layup's own flags: --help, --version
    const std::string flag = typed.substr(0, typed.find('='));
    const std::vector<std::string> flags = flag_names(app);
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) return "";
    const std::string near = nearest_name(flag, flags);
    return "`layup` has no flag " + flag + (near.empty() ? "" : "; did you mean " + near + "?") +
           " (a command's flags go after the command: layup train --steps 100)";
  }
  const std::vector<std::string> names = subcommand_names(app);
  if (std::find(names.begin(), names.end(), typed) != names.end()) return "";
  const std::string near = nearest_name(typed, names);
  return "unknown command '" + typed + "'" +
         (near.empty() ? "" : "; did you mean `layup " + near + "`?") +
         " (the commands: " + listed(names) + "; `layup --help` says what each does)";
}

std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& error) {
  // By type: CLI11 names some errors after the subcommand that threw them.
  const auto is = [&error]<class Kind>(const Kind*) {
    return dynamic_cast<const Kind*>(&error) != nullptr;
  };
  const std::string message = error.what();
  if (is(static_cast<const CLI::ExtrasError*>(nullptr))) return describe_extras(app, message);
  if (is(static_cast<const CLI::ConversionError*>(
          nullptr))) {  // "Could not convert: --layers = 2147483648"
    const size_t from = message.find(": "), equals = message.find(" = ");
    if (from != std::string::npos && equals != std::string::npos && equals > from) {
      const std::string name = message.substr(from + 2, equals - from - 2);
      if (const CLI::Option* option = option_named(app, name))
        return name + " must be " + as_phrase(option->get_type_name()) + " (got '" +
               message.substr(equals + 3) + "')";
    }
    return message;
  }
  if (is(static_cast<const CLI::RequiredError*>(nullptr)) &&
      message.find("subcommand") != std::string::npos)
    return "give a command: " + listed(subcommand_names(app)) +
           " (`layup --help` says what each does; `layup train` alone trains a small model)";
  // "--batch: must be ..." or "--batch: 1 required INT missing": the flag, then what is wrong.
  const size_t colon = message.find(": ");
  const std::string name = colon == std::string::npos ? "" : message.substr(0, colon);
  const CLI::Option* option = name.empty() ? nullptr : option_named(app, name);
  if (option == nullptr) return message;
  std::string detail = message.substr(colon + 2);
  if (detail.starts_with(name + " ")) detail = detail.substr(name.size() + 1);  // named twice
  if (is(static_cast<const CLI::ArgumentMismatch*>(nullptr)))
    return name + " needs a value after it: " + as_phrase(option->get_type_name());
  return name + " " + detail;
}

}  // namespace layup
