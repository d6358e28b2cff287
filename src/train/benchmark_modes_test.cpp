// `layup bench` in every mode, and its trace: only timed steps, at most kMaxTracedSteps of them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "core/error.h"
#include "train/benchmark.h"
#include "train/tiny_benchmark.h"

namespace layup {
namespace {

BenchmarkOptions tiny_options(const std::string& mode) {
  BenchmarkOptions options = tiny_benchmark_options();
  options.mode = parse_in(kModeNames, mode, "mode");
  return options;
}

TEST(BenchmarkModes, EveryModeRunsAndIsNamed) {
  float first_loss = 0.0f;
  for (const char* mode : {"gpu", "offload", "layup"}) {
    const BenchmarkOptions options = tiny_options(mode);
    const BenchmarkResult result = run_benchmark(options);
    // The same steps on the same data: the modes agree bitwise on the CPU backend.
    if (std::string(mode) == "gpu") first_loss = result.last_loss;
    EXPECT_EQ(result.last_loss, first_loss) << mode;
    EXPECT_EQ(result.schedule.rfind(mode, 0), 0u) << result.schedule;
    EXPECT_NE(format_benchmark_table(options, result).find(result.schedule), std::string::npos);
    const nlohmann::json json = benchmark_json(options, result, "layup bench");
    EXPECT_EQ(json["mode"], mode);
    EXPECT_EQ(json["schedule"], result.schedule);
    EXPECT_TRUE(json["trace"].is_null());
    // The CPU AdamW modes name their workers and report the engine's rate.
    const bool on_cpu = std::string(mode) != "gpu";
    EXPECT_EQ(json["cpu_workers"].is_null(), !on_cpu);
    EXPECT_EQ(json["cpu_adamw"].is_null(), !on_cpu);
    EXPECT_EQ(result.cpu_adamw.rfind("CPU AdamW: ", 0) == 0, on_cpu) << result.cpu_adamw;
    // The floor is reported where a CPU AdamW runs, and adds up as the header says.
    EXPECT_EQ(json["floor"].is_null(), !on_cpu);
    if (!on_cpu) continue;
    const StepFloor& floor = result.floor;
    EXPECT_GT(floor.forward_ms, 0.0);
    EXPECT_GT(floor.backward_ms, 0.0);
    EXPECT_GT(floor.adamw_blocks_ms, 0.0);
    EXPECT_GT(floor.adamw_head_ms, 0.0);
    EXPECT_DOUBLE_EQ(floor.total_ms, floor.forward_ms +
                                         std::max(floor.backward_ms, floor.adamw_blocks_ms) +
                                         floor.adamw_head_ms);
    EXPECT_DOUBLE_EQ(json["floor"]["median_over_floor"].get<double>(),
                     result.median_ms / floor.total_ms);
    EXPECT_NE(format_benchmark_table(options, result).find("floor"), std::string::npos);
  }
  EXPECT_THROW(run_benchmark(tiny_options("zero")), Error);
}

TEST(BenchmarkModes, TracesOnlyTheFirstTimedSteps) {
  BenchmarkOptions options = tiny_options("layup");
  options.steps = kMaxTracedSteps + 2;
  options.clip = 0.0f;
  options.trace_path = (std::filesystem::temp_directory_path() /
                        ("layup_bench_trace_" + std::to_string(getpid()) + ".json"))
                           .string();
  const BenchmarkResult result = run_benchmark(options);
  EXPECT_EQ(result.traced_steps, kMaxTracedSteps);
  std::ifstream in(options.trace_path);
  const nlohmann::json parsed = nlohmann::json::parse(in);
  std::filesystem::remove(options.trace_path);

  std::set<std::string> step_spans;
  int forwards = 0;
  for (const nlohmann::json& event : parsed["traceEvents"]) {
    if (event["ph"] != "X") continue;
    const std::string name = event["name"];
    if (name.rfind("timed step ", 0) == 0) step_spans.insert(name);
    forwards += name == "forward";
  }
  EXPECT_EQ(step_spans.size(), static_cast<size_t>(kMaxTracedSteps));
  EXPECT_TRUE(step_spans.count("timed step 1"));
  EXPECT_TRUE(step_spans.count("timed step " + std::to_string(kMaxTracedSteps)));
  EXPECT_EQ(forwards, kMaxTracedSteps);  // no warm-up step, nothing after the cap
  EXPECT_EQ(parsed["otherData"]["mode"], "layup");
  const nlohmann::json json = benchmark_json(options, result, "layup bench");
  EXPECT_EQ(json["trace"], options.trace_path);
  EXPECT_EQ(json["clip"], "none");
}

}  // namespace
}  // namespace layup
