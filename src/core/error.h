// The one error type of layup, and the helpers that build its messages.
//
// Every failure a user can cause (a bad flag, a damaged file, a model that does not fit) is
// reported as a layup::Error whose message names the cause and what to change. The CLI catches
// it at the top, prints the message, and exits non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace layup {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates the parts with operator<< and throws them as one Error.
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

}  // namespace layup

// Throws layup::Error with the streamed parts when the condition does not hold.
#define LAYUP_CHECK(condition, ...)               \
  do {                                            \
    if (!(condition)) ::layup::fail(__VA_ARGS__); \
  } while (0)
