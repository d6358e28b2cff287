// Stopping a run cleanly: while a StopSignals lives, the first SIGINT or SIGTERM (Ctrl-C, a
// cluster's preemption) only asks the training loop to stop after its current step and write a
// checkpoint; the second ends the process at once, as the default action does.
#pragma once

namespace layup {

class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // puts the previous handlers back
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked to stop (SIGINT or SIGTERM), or 0.
  static int requested();
  // "SIGINT (Ctrl-C)", "SIGTERM".
  static const char* name(int signal);
};

}  // namespace layup
