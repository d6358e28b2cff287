// The run-describing helpers of train/run_info.h: /proc, the clock and git.
#include "train/run_info.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>

namespace layup {

std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  for (char& c : text)
    if (c == '\0') c = ' ';
  return text;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        const size_t start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "unknown";
}

std::string hostname() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? name : "unknown";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

std::string git_commit() {
  const std::string source_dir = std::string(LAYUP_DATA_DIR) + "/..";
  const std::string command = "git -C '" + source_dir + "' rev-parse HEAD 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return "unknown";
  char line[128] = {};
  const bool got = std::fgets(line, sizeof line, pipe) != nullptr;
  const int status = pclose(pipe);
  std::string commit = got ? line : "";
  while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r')) commit.pop_back();
  return status == 0 && commit.size() == 40 ? commit : "unknown";
}

}  // namespace layup
