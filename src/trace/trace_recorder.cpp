// TraceRecorder: spans in one mutex-protected vector, written in the Trace Event Format.
#include "trace/trace_recorder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {

TraceRecorder::TraceRecorder() : origin_(std::chrono::steady_clock::now()) {
  events_.reserve(4096);
}

int TraceRecorder::track(std::string_view name) {
  std::lock_guard lock(mutex_);
  const auto found = std::find(track_names_.begin(), track_names_.end(), name);
  if (found != track_names_.end()) return static_cast<int>(found - track_names_.begin()) + 1;
  track_names_.emplace_back(name);
  return static_cast<int>(track_names_.size());
}

std::string TraceRecorder::track_name(int track) const {
  std::lock_guard lock(mutex_);
  LAYUP_CHECK(track >= 1 && track <= static_cast<int>(track_names_.size()), "trace track ", track,
              " does not exist; make tracks with TraceRecorder::track");
  return track_names_[track - 1];
}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
      .count();
}

void TraceRecorder::add_span(int track, std::string name, double start_us, double end_us) {
  std::lock_guard lock(mutex_);
  events_.push_back({track, std::move(name), start_us, end_us});
}

void TraceRecorder::set_metadata(const std::string& key, nlohmann::json value) {
  std::lock_guard lock(mutex_);
  metadata_[key] = std::move(value);
}

std::vector<TraceEvent> TraceRecorder::events() const {
  std::vector<TraceEvent> events;
  {
    std::lock_guard lock(mutex_);
    events = events_;
  }
  // Threads append when a span ends, so the vector is in end order; readers want start order,
  // and of two spans that start together the enclosing (longer) one first.
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us != b.start_us ? a.start_us < b.start_us : a.end_us > b.end_us;
  });
  return events;
}

nlohmann::json TraceRecorder::to_json() const {
  constexpr int kPid = 1;
  std::vector<std::string> track_names;
  nlohmann::json metadata;
  {
    std::lock_guard lock(mutex_);
    track_names = track_names_;
    metadata = metadata_;
  }
  nlohmann::json trace_events = nlohmann::json::array();
  trace_events.push_back({{"ph", "M"},
                          {"name", "process_name"},
                          {"pid", kPid},
                          {"tid", 0},
                          {"args", {{"name", "layup"}}}});
  for (size_t i = 0; i < track_names.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    trace_events.push_back({{"ph", "M"},
                            {"name", "thread_name"},
                            {"pid", kPid},
                            {"tid", tid},
                            {"args", {{"name", track_names[i]}}}});
    // Without it viewers order tracks by their own rules; with it, in the order they were made.
    trace_events.push_back({{"ph", "M"},
                            {"name", "thread_sort_index"},
                            {"pid", kPid},
                            {"tid", tid},
                            {"args", {{"sort_index", tid}}}});
  }
  // Rounded to nanoseconds, the clock's resolution: no digits of float noise in the file.
  auto to_ns = [](double us) { return std::round(us * 1e3) / 1e3; };
  for (const TraceEvent& event : events()) {
    trace_events.push_back({{"ph", "X"},
                            {"name", event.name},
                            {"pid", kPid},
                            {"tid", event.track},
                            {"ts", to_ns(event.start_us)},
                            {"dur", to_ns(event.end_us - event.start_us)}});
  }
  return {{"traceEvents", std::move(trace_events)},
          {"displayTimeUnit", "ms"},
          {"otherData", std::move(metadata)}};
}

void TraceRecorder::write(const std::string& path) const {
  const std::string text = to_json().dump() + "\n";
  write_text_atomically(path, text);
}

size_t trace_file_bytes_estimate(long long steps, int layers) {
  constexpr size_t kSpansPerBlockAndStep = 16, kBytesPerSpan = 200, kFixedBytes = 64 << 10;
  return kFixedBytes + static_cast<size_t>(std::max(steps, 0LL)) *
                           (static_cast<size_t>(std::max(layers, 0)) + 2) * kSpansPerBlockAndStep *
                           kBytesPerSpan;
}

void check_trace_path(const std::string& path) {
  namespace fs = std::filesystem;
  LAYUP_CHECK(!path.empty(), "--trace needs a file name");
  const fs::path absolute = fs::absolute(path);
  LAYUP_CHECK(!fs::is_directory(absolute), "--trace ", path,
              " is a folder; give a file name, e.g. ", (absolute / "trace.json").string());
  LAYUP_CHECK(fs::is_directory(absolute.parent_path()), "--trace ", path, ": the folder ",
              absolute.parent_path().string(), " does not exist; create it first");
}

void TraceSpan::finish() {
  try {
    std::string name = name_;
    if (index_ >= 0) {
      name += ' ';
      name += std::to_string(index_);
    }
    recorder_->add_span(track_, std::move(name), start_us_, recorder_->now_us());
  } catch (...) {
    // Out of memory while tracing: lose the span, not the training run (a destructor must not
    // throw).
  }
}

}  // namespace layup
