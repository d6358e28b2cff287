// Renders a parsed chat template (jinja_parser.h) with jinja2's semantics: Python's values and
// operators, jinja2's Undefined (prints as "", is false, iterates as empty; any other use is an
// error), a fresh scope for each iteration of a for loop (a set inside a loop does not leak out;
// namespace() objects carry values across), and the filters, tests, methods and functions the
// parser admits.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_value.h"

namespace layup::jinja {

// The functions every template sees, as transformers gives them: raise_exception, namespace,
// range, strftime_now.
std::vector<std::pair<std::string, Value>> builtin_globals();

// Throws layup::Error for an error the template makes (adding a string to a number, using an
// undefined value) and for raise_exception(message), whose message it carries.
std::string render(const Template& tmpl, const std::vector<std::pair<std::string, Value>>& globals);

}  // namespace layup::jinja
