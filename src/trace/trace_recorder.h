// Timelines of training steps, written as a Chrome/Perfetto trace (chrome://tracing, or
// https://ui.perfetto.dev): one named track per thread of work (the device thread, each CPU
// worker, the training loop) and one span per piece of work on it (a block's backward, a block's
// AdamW, ...).
//
// Recording is cheap and safe from any thread: a span is a few numbers appended to one vector
// under a mutex, a few dozen per step, against spans that last milliseconds. A schedule with no
// recorder (a null pointer) or a recorder that is not recording does nothing but a branch: a
// TraceSpan builds its name only when it records.
//
// Clock: microseconds since the recorder was made, on steady_clock. Spans are either measured
// here (TraceSpan, RAII around host code) or measured elsewhere and handed in with add_span: that
// is the entry point for device work timed with CUDA events (convert the event times to this
// clock, then add_span). Today device spans are host time around the call, which on the CPU
// backend is the work itself and on CUDA only the (asynchronous) launch.
//
// File format (the Trace Event Format): {"traceEvents": [...]} with one "X" (complete) event per
// span (ts and dur in microseconds, pid 1, tid = the track) and "M" (metadata) events that name
// the process and every track and keep the tracks in the order they were made.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

struct TraceEvent {
  int track = 0;  // from TraceRecorder::track
  std::string name;
  double start_us = 0.0;
  double end_us = 0.0;
};

class TraceRecorder {
 public:
  // Records from the start; set_recording(false) to start later.
  TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  // The id of the track called `name`, made on first use. Ids are small positive integers in
  // the order the tracks were made (the file's tids).
  int track(std::string_view name);
  std::string track_name(int track) const;

  // Spans that start while not recording are dropped: how a caller records only the steps it
  // wants (e.g. the timed steps of a benchmark, not its warm-up).
  void set_recording(bool on) { recording_.store(on, std::memory_order_relaxed); }
  bool recording() const { return recording_.load(std::memory_order_relaxed); }

  // Microseconds since the recorder was made.
  double now_us() const;

  // A span measured by the caller, in now_us() time. Recorded whatever set_recording says: the
  // caller asked recording() when it started measuring.
  void add_span(int track, std::string name, double start_us, double end_us);

  // A key of the file's "otherData" (what ran: mode, model, command line).
  void set_metadata(const std::string& key, nlohmann::json value);

  // The spans recorded so far, sorted by start time.
  std::vector<TraceEvent> events() const;

  // The whole trace in the Trace Event Format.
  nlohmann::json to_json() const;

  // Writes to_json() to `path` atomically. Throws layup::Error when the file cannot be written.
  void write(const std::string& path) const;

 private:
  const std::chrono::steady_clock::time_point origin_;
  std::atomic<bool> recording_{true};
  mutable std::mutex mutex_;
  std::vector<std::string> track_names_;  // track id - 1 -> name
  std::vector<TraceEvent> events_;
  nlohmann::json metadata_ = nlohmann::json::object();
};

// A generous size of the trace of `steps` steps of a model of `layers` blocks, for the check of
// its disk before a run: each block records a few spans a step on each track (forward, backward,
// copies, updates), each span some 150 bytes of JSON.
size_t trace_file_bytes_estimate(long long steps, int layers);

// Throws layup::Error when a trace cannot be written to `path` (its folder does not exist, or
// it names a folder): checked before a run, not after its last step, when the trace is written.
void check_trace_path(const std::string& path);

// Records the span from construction to destruction on `track`, named `name` or, with an index,
// "name index" (e.g. "backward_block 3"). Does nothing when the recorder is null or was not
// recording at construction; `name` must outlive the span (a string literal).
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* recorder, int track, const char* name, int index = -1)
      : recorder_(recorder != nullptr && recorder->recording() ? recorder : nullptr),
        track_(track),
        name_(name),
        index_(index),
        start_us_(recorder_ != nullptr ? recorder_->now_us() : 0.0) {}
  ~TraceSpan() {
    if (recorder_ != nullptr) finish();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  void finish();

  TraceRecorder* recorder_;
  int track_;
  const char* name_;
  int index_;
  double start_us_;
};

}  // namespace layup
