// Progress line rendering.
#include "train/progress_line.h"

#include <unistd.h>

namespace layup {

ProgressLine::ProgressLine(std::FILE* stream, int total_steps, int every)
    : stream_(stream),
      total_steps_(total_steps),
      every_(every < 1 ? 1 : every),
      terminal_(isatty(fileno(stream)) != 0),
      start_(std::chrono::steady_clock::now()) {}

double ProgressLine::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

std::string ProgressLine::format_duration(double seconds) {
  if (!(seconds >= 0.0)) return "--:--";
  const long total = static_cast<long>(seconds + 0.5);
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(text, sizeof text, "%02ld:%02ld", total / 60, total % 60);
  return text;
}

void ProgressLine::update(int step, const std::string& text) {
  if (!terminal_ && step % every_ != 0 && step != total_steps_) return;
  std::fprintf(stream_, "%s%s", terminal_ ? "\r\033[K" : "", text.c_str());
  if (terminal_) {
    line_open_ = true;
  } else {
    std::fputc('\n', stream_);
  }
  std::fflush(stream_);
}

void ProgressLine::message(const std::string& text) {
  if (line_open_) std::fputs("\r\033[K", stream_);
  std::fprintf(stream_, "%s\n", text.c_str());
  line_open_ = false;
  std::fflush(stream_);
}

void ProgressLine::finish() {
  if (line_open_) std::fputc('\n', stream_);
  line_open_ = false;
  std::fflush(stream_);
}

}  // namespace layup
