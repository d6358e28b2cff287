// SIGINT/SIGTERM handlers for the training loop (stop_signals.h).
#include "train/stop_signals.h"

#include <atomic>
#include <csignal>

namespace layup {

namespace {

std::atomic<int> stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "the handler may only touch lock-free atomics");

struct sigaction previous_int, previous_term;

void on_stop_signal(int signal) {
  stop_signal.store(signal);
  // The next one gets the default action: a second Ctrl-C ends the process at once.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigaction(SIGINT, &default_action, nullptr);
  sigaction(SIGTERM, &default_action, nullptr);
}

}  // namespace

StopSignals::StopSignals() {
  stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write under way goes on: the step finishes
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

int StopSignals::requested() {
  return stop_signal.load();
}

const char* StopSignals::name(int signal) {
  return signal == SIGINT ? "SIGINT (Ctrl-C)" : signal == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace layup
