// The live progress line of long work: step, loss, tokens/s, elapsed time, ETA.
//
// On a terminal the line is redrawn in place; otherwise (a log file, CI) a full line is printed
// every `every` steps so logs stay readable.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace layup {

class ProgressLine {
 public:
  ProgressLine(std::FILE* stream, int total_steps, int every);

  // Shows the state after `step` (1-based) of total_steps; `extra` is appended.
  void update(int step, const std::string& text);
  // Prints a message on its own line without breaking the progress line.
  void message(const std::string& text);
  void finish();

  // Seconds since construction.
  double elapsed_s() const;

  static std::string format_duration(double seconds);

 private:
  std::FILE* stream_;
  int total_steps_;
  int every_;
  bool terminal_;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace layup
