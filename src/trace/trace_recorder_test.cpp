// TraceRecorder: spans from RAII and from add_span, recording on and off, many threads at once,
// and the Trace Event Format file that Chrome and Perfetto read.
#include "trace/trace_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"

namespace layup {
namespace {

TEST(TraceRecorder, TracksAreNumberedInOrderAndFoundAgainByName) {
  TraceRecorder trace;
  EXPECT_EQ(trace.track("GPU"), 1);
  EXPECT_EQ(trace.track("cpu worker 0"), 2);
  EXPECT_EQ(trace.track("GPU"), 1);
  EXPECT_EQ(trace.track_name(2), "cpu worker 0");
  EXPECT_THROW(trace.track_name(3), Error);
}

TEST(TraceRecorder, SpansHaveNamesIndicesAndOrderedTimes) {
  TraceRecorder trace;
  const int gpu = trace.track("GPU");
  {
    TraceSpan outer(&trace, gpu, "forward");
    TraceSpan inner(&trace, gpu, "backward_block", 3);
  }
  // A span timed elsewhere (as device events would be), starting after the RAII spans ended.
  const double later_us = trace.now_us() + 100.0;
  trace.add_span(gpu, "measured elsewhere", later_us, later_us + 1.5);
  const std::vector<TraceEvent> events = trace.events();
  ASSERT_EQ(events.size(), 3u);
  // Sorted by start: the outer RAII span, the inner one, then the explicit one.
  EXPECT_EQ(events[0].name, "forward");
  EXPECT_EQ(events[1].name, "backward_block 3");
  EXPECT_LE(events[0].start_us, events[1].start_us);
  EXPECT_GE(events[0].end_us, events[1].end_us);  // the outer span ends after the inner one
  EXPECT_LE(events[1].start_us, events[1].end_us);
  EXPECT_EQ(events[2].name, "measured elsewhere");
  EXPECT_EQ(events[2].start_us, later_us);
  EXPECT_EQ(events[2].end_us, later_us + 1.5);
  for (const TraceEvent& event : events) EXPECT_EQ(event.track, gpu);
}

TEST(TraceRecorder, RecordsNothingWhenOffOrNull) {
  TraceRecorder trace;
  const int gpu = trace.track("GPU");
  trace.set_recording(false);
  { TraceSpan skipped(&trace, gpu, "warm-up step"); }
  trace.set_recording(true);
  {
    TraceSpan kept(&trace, gpu, "timed step", 1);
    // A span that started while recording is kept even if recording stops before it ends.
    trace.set_recording(false);
  }
  { TraceSpan nothing(nullptr, 0, "no recorder"); }
  const std::vector<TraceEvent> events = trace.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "timed step 1");
}

TEST(TraceRecorder, ManyThreadsRecordAtOnce) {
  constexpr int kThreads = 4;
  constexpr int kSpansPerThread = 500;
  TraceRecorder trace;
  std::vector<int> tracks;
  for (int i = 0; i < kThreads; ++i)
    tracks.push_back(trace.track("cpu worker " + std::to_string(i)));
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kSpansPerThread; ++k) TraceSpan span(&trace, tracks[i], "adamw block", k);
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::map<int, std::set<std::string>> names_by_track;
  for (const TraceEvent& event : trace.events()) names_by_track[event.track].insert(event.name);
  ASSERT_EQ(names_by_track.size(), static_cast<size_t>(kThreads));
  for (const auto& [track, names] : names_by_track)
    EXPECT_EQ(names.size(), static_cast<size_t>(kSpansPerThread)) << trace.track_name(track);
}

TEST(TraceRecorder, WritesTheTraceEventFormat) {
  TraceRecorder trace;
  const int gpu = trace.track("GPU");
  const int worker = trace.track("cpu worker 0");
  trace.set_metadata("mode", "layup");
  trace.add_span(gpu, "backward_block 1", 10.0, 30.0);
  trace.add_span(worker, "adamw block 1", 31.0, 35.5);

  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("layup_trace_test_" + std::to_string(getpid()) + ".json");
  trace.write(path.string());
  std::ifstream in(path);
  const nlohmann::json parsed = nlohmann::json::parse(in);
  std::filesystem::remove(path);

  ASSERT_TRUE(parsed.contains("traceEvents"));
  EXPECT_EQ(parsed["otherData"]["mode"], "layup");
  std::map<int, std::string> track_names;
  std::vector<nlohmann::json> spans;
  for (const nlohmann::json& event : parsed["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name")
      track_names[event["tid"].get<int>()] = event["args"]["name"];
    if (event["ph"] == "X") spans.push_back(event);
  }
  EXPECT_EQ(track_names, (std::map<int, std::string>{{gpu, "GPU"}, {worker, "cpu worker 0"}}));
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0]["name"], "backward_block 1");
  EXPECT_EQ(spans[0]["tid"], gpu);
  EXPECT_EQ(spans[0]["pid"], 1);
  EXPECT_DOUBLE_EQ(spans[0]["ts"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(spans[0]["dur"].get<double>(), 20.0);
  EXPECT_EQ(spans[1]["name"], "adamw block 1");
  EXPECT_EQ(spans[1]["tid"], worker);
  EXPECT_DOUBLE_EQ(spans[1]["dur"].get<double>(), 4.5);
}

TEST(TraceRecorder, RefusesAPathItCannotWrite) {
  const std::filesystem::path temp = std::filesystem::temp_directory_path();
  EXPECT_NO_THROW(check_trace_path((temp / "trace.json").string()));
  EXPECT_THROW(check_trace_path(temp.string()), Error);
  EXPECT_THROW(check_trace_path((temp / "no-such-folder-for-layup" / "t.json").string()), Error);
}

}  // namespace
}  // namespace layup
