// `layup bench`'s measurement on a tiny model on the CPU, and its FLOP count pinned by hand.
#include "train/benchmark.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "train/tiny_benchmark.h"

namespace layup {
namespace {

BenchmarkOptions tiny_options() {
  BenchmarkOptions options = tiny_benchmark_options();
  options.grad_accum = 2;
  options.steps = 4;
  return options;
}

TEST(Benchmark, FlopsPerTokenOfGpt2) {
  // gpt2: L = 12, C = 768, V = 50257, T = 1024.
  //   N = 12 * 12 * 768^2 + 50257 * 768 = 84,934,656 + 38,597,376 = 123,532,032
  //   6N = 741,192,192;  12 L T C = 12 * 12 * 1024 * 768 = 113,246,208
  EXPECT_DOUBLE_EQ(training_flops_per_token(named_config("gpt2"), 1024), 854438400.0);
}

TEST(Benchmark, FlopsPerTokenOfLlama3_8B) {
  // Llama 3 8B: L = 32, C = 4096, 32 query heads and 8 K/V heads of 128, I = 14336, V = 128256.
  //   a block's matmul weights: 4096 * 6144 (q,k,v) + 4096 * 4096 (o_proj)
  //   + 3 * 14336 * 4096 (gate, up, down) = 218,103,808
  //   N = 32 * 218,103,808 + 128256 * 4096 (untied head) = 7,504,658,432
  //   (with the embedding and the norms: 8,030,261,248, the published count)
  //   6N = 45,027,950,592;  12 L T C at T = 2048: 3,221,225,472
  const ModelConfig config = llama_config(32, 32, 8, 4096, 14336, 8192, 128256);
  EXPECT_DOUBLE_EQ(training_flops_per_token(config, 2048), 48249176064.0);
}

TEST(Benchmark, KnownPeaks) {
  EXPECT_DOUBLE_EQ(bf16_peak_flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(bf16_peak_flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_EQ(bf16_peak_flops("AMD EPYC 7B13"), 0.0);
}

TEST(Benchmark, TimesStepsOnTheCpu) {
  const BenchmarkOptions options = tiny_options();
  const BenchmarkResult result = run_benchmark(options);
  EXPECT_EQ(result.device, DeviceKind::kCpu);
  EXPECT_EQ(result.dtype, Dtype::kFp32);
  ASSERT_EQ(result.step_ms.size(), 4u);
  EXPECT_EQ(result.tokens_per_step, 2 * 16 * 2);
  EXPECT_GT(result.tokens_per_s, 0.0);
  EXPECT_GT(result.min_ms, 0.0);
  EXPECT_LE(result.min_ms, result.median_ms);
  EXPECT_LE(result.median_ms, result.max_ms);
  double total_s = 0.0;
  for (double ms : result.step_ms) total_s += ms / 1e3;
  EXPECT_NEAR(result.tokens_per_s, 4.0 * 2 * 16 * 2 / total_s, 1e-9 * result.tokens_per_s);
  EXPECT_EQ(result.peak_flops, 0.0);  // no CPU peak claimed, so no MFU
  EXPECT_EQ(result.mfu, 0.0);
  EXPECT_GT(result.memory_peak_bytes, 0);
  EXPECT_TRUE(std::isfinite(result.last_loss));

  const std::string table = format_benchmark_table(options, result);
  EXPECT_NE(table.find("tokens/s"), std::string::npos);
  EXPECT_NE(table.find("n/a"), std::string::npos);

  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("layup_bench_test_" + std::to_string(getpid()) + ".json");
  std::ofstream(path) << benchmark_json(options, result, "layup bench --test").dump(2);
  std::ifstream in(path);
  const nlohmann::json parsed = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  for (const char* key : {"engine",
                          "command_line",
                          "model",
                          "batch",
                          "seq_len",
                          "grad_accum",
                          "warmup_steps",
                          "steps",
                          "device",
                          "dtype",
                          "device_name",
                          "step_ms",
                          "median_ms",
                          "min_ms",
                          "max_ms",
                          "tokens_per_s",
                          "flops_per_token",
                          "mfu",
                          "memory_peak_bytes",
                          "memory_source",
                          "machine",
                          "date",
                          "git_commit"})
    EXPECT_TRUE(parsed.contains(key)) << key;
  EXPECT_EQ(parsed["command_line"], "layup bench --test");
  EXPECT_TRUE(parsed["mfu"].is_null());
  EXPECT_DOUBLE_EQ(parsed["tokens_per_s"].get<double>(), result.tokens_per_s);
  EXPECT_TRUE(parsed["machine"].contains("hostname"));
  EXPECT_TRUE(parsed["machine"].contains("cpu"));
  // The commit the build recorded: a full hash, "-dirty" when the tree differed from it, or
  // "unknown" outside a git checkout.
  const std::string commit = parsed["git_commit"];
  const std::string hash = commit.substr(0, 40);
  const bool full_hash =
      hash.size() == 40 && hash.find_first_not_of("0123456789abcdef") == std::string::npos;
  EXPECT_TRUE(commit == "unknown" ||
              (full_hash && (commit.size() == 40 || commit.substr(40) == "-dirty")))
      << commit;
}

// --energy: one reading per source the machine has, over the timed steps; each either counted
// or unavailable with its reason (never an estimate). Without it, no reading at all.
TEST(Benchmark, ReadsEnergyOverTheTimedStepsWhenAsked) {
  BenchmarkOptions options = tiny_options();
  EXPECT_TRUE(run_benchmark(options).energy.empty());
  EXPECT_TRUE(benchmark_json(options, run_benchmark(options), "")["energy"].is_null());

  options.energy = true;
  const BenchmarkResult result = run_benchmark(options);
  ASSERT_FALSE(result.energy.empty());
  double timed_s = 0.0;
  for (double ms : result.step_ms) timed_s += ms / 1e3;
  const nlohmann::json json = benchmark_json(options, result, "");
  ASSERT_EQ(json["energy"].size(), result.energy.size());
  for (size_t i = 0; i < result.energy.size(); ++i) {
    const EnergyReading& reading = result.energy[i];
    SCOPED_TRACE(reading.source);
    // The interval spans the timed steps, and little more.
    EXPECT_GE(reading.seconds, timed_s);
    EXPECT_LT(reading.seconds, timed_s + 1.0);
    if (reading.available) {
      EXPECT_GT(reading.joules, 0.0);
      EXPECT_NEAR(json["energy"][i]["joules_per_step"].get<double>(), reading.joules / 4, 1e-9);
    } else {
      EXPECT_FALSE(reading.unavailable_reason.empty());
      EXPECT_EQ(json["energy"][i]["unavailable_reason"], reading.unavailable_reason);
      EXPECT_FALSE(json["energy"][i].contains("joules"));
    }
  }
  EXPECT_NE(format_benchmark_table(options, result).find("energy"), std::string::npos);
}

// A time limit shorter than one step: one warm-up step and one timed step, and the table says the
// run was cut short. Without a limit every step runs.
TEST(Benchmark, AStepLongerThanTheTimeLimitEndsTheRunAfterOneTimedStep) {
  BenchmarkOptions options = tiny_options();
  options.warmup_steps = 3;
  options.time_limit_s = 1e-9;
  const BenchmarkResult cut = run_benchmark(options);
  EXPECT_EQ(cut.warmup_steps_run, 1);
  EXPECT_EQ(cut.step_ms.size(), 1u);
  EXPECT_NE(format_benchmark_table(options, cut).find("out of time"), std::string::npos);
  EXPECT_EQ(benchmark_json(options, cut, "")["timed_steps"], 1);

  options.time_limit_s = 0.0;
  const BenchmarkResult whole = run_benchmark(options);
  EXPECT_EQ(whole.warmup_steps_run, 3);
  EXPECT_EQ(whole.step_ms.size(), 4u);
  EXPECT_EQ(format_benchmark_table(options, whole).find("out of time"), std::string::npos);
}

TEST(Benchmark, RefusesASequenceLongerThanTheContext) {
  BenchmarkOptions options = tiny_options();
  options.seq_len = 64;
  EXPECT_ANY_THROW(run_benchmark(options));
}

}  // namespace
}  // namespace layup
