// The memory plan through the `layup` program: a run over its budget is refused before anything
// is allocated (quickly, with the message, leaving no run folder), `layup memory` prints the
// three modes side by side, and `layup study` writes a plan that --plan reads. Runs the binary
// named by LAYUP_LAYUP_BINARY (set by CMake for ctest).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace layup {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  double seconds = 0.0;
};

Outcome run_layup(const std::string& arguments) {
  const char* binary = std::getenv("LAYUP_LAYUP_BINARY");
  Outcome outcome;
  if (binary == nullptr) return outcome;
  const fs::path log = fs::temp_directory_path() / ("layup_memory_cli_" + std::to_string(getpid()));
  const std::string command =
      std::string("'") + binary + "' " + arguments + " > '" + log.string() + "' 2>&1";
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  outcome.output = text.str();
  fs::remove(log);
  return outcome;
}

#define REQUIRE_BINARY()                            \
  if (std::getenv("LAYUP_LAYUP_BINARY") == nullptr) \
  GTEST_SKIP() << "LAYUP_LAYUP_BINARY is not set (ctest sets it to build/layup)"

TEST(MemoryCli, TrainOverTheBudgetIsRefusedBeforeAllocating) {
  REQUIRE_BINARY();
  const fs::path out = fs::temp_directory_path() / ("layup_budget_run_" + std::to_string(getpid()));
  fs::remove_all(out);
  for (const char* mode_and_batch :
       {"--mode gpu --batch 8 --seq-len 1024", "--mode offload --batch 4 --seq-len 1024",
        "--mode layup --batch 4 --seq-len 1024"}) {
    SCOPED_TRACE(mode_and_batch);
    // gpt2-large in fp32 would take well over 32 GiB and minutes to allocate and initialize: a
    // quick exit means nothing was.
    const Outcome outcome = run_layup(
        std::string(
            "train --device cpu --model gpt2-large --memory-budget 32G --allow-overcommit ") +
        mode_and_batch + " --out '" + out.string() + "'");
    EXPECT_NE(outcome.exit_code, 0) << outcome.output;
    EXPECT_NE(outcome.output.find("over --memory-budget 32.00 GiB"), std::string::npos)
        << outcome.output;
    EXPECT_NE(outcome.output.find("The largest class is"), std::string::npos) << outcome.output;
    EXPECT_NE(outcome.output.find("Within the budget: "), std::string::npos) << outcome.output;
    EXPECT_LT(outcome.seconds, 20.0);
    EXPECT_FALSE(fs::exists(out)) << "a refused run leaves no run folder";
  }
}

TEST(MemoryCli, MemoryCommandComparesTheModes) {
  REQUIRE_BINARY();
  const Outcome outcome =
      run_layup("memory --device cpu --model gpt2-large --batch 8 --seq-len 1024");
  ASSERT_EQ(outcome.exit_code, 0) << outcome.output;
  EXPECT_NE(outcome.output.find("86.4% less in layup"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("nothing is allocated"), std::string::npos);
  EXPECT_LT(outcome.seconds, 20.0);

  // The unified-memory board: gpt2-xl at the full context fits 32 GiB only in layup with
  // --clip none.
  const Outcome budget = run_layup(
      "memory --device cpu --model gpt2-xl --batch 1 --seq-len 1024 --memory-budget 32G "
      "--mode layup --clip none");
  ASSERT_EQ(budget.exit_code, 0) << budget.output;
  EXPECT_NE(budget.output.find("REFUSED        REFUSED           fits"), std::string::npos)
      << budget.output;
  EXPECT_NE(budget.output.find("memory plan for gpt2-xl in layup mode"), std::string::npos)
      << budget.output;

  // A run that writes no checkpoint (bench, train --no-checkpoints) needs no checkpoint writer's
  // scratch: a smaller transient.
  const Outcome writes = run_layup("memory --device cpu --model small --seq-len 64 --mode layup");
  const Outcome no_checkpoints =
      run_layup("memory --device cpu --model small --seq-len 64 --mode layup --no-checkpoints");
  ASSERT_EQ(no_checkpoints.exit_code, 0) << no_checkpoints.output;
  EXPECT_NE(writes.output.find("the checkpoint writer's or reader's scratch"), std::string::npos)
      << writes.output;
  EXPECT_EQ(no_checkpoints.output.find("checkpoint writer"), std::string::npos)
      << no_checkpoints.output;

  const Outcome bad_place =
      run_layup("memory --device cpu --model small --seq-len 64 --place grads=device");
  EXPECT_NE(bad_place.exit_code, 0);
  EXPECT_NE(bad_place.output.find("the CPU backend has only host memory"), std::string::npos)
      << bad_place.output;
}

// With a calibration file `layup memory` predicts each mode's step time (engine/step_time_model.h)
// and prints the parts of one; without one it says how to make one; a corrupt one is refused.
TEST(MemoryCli, MemoryCommandPredictsTheStepTimeFromACalibration) {
  REQUIRE_BINARY();
  const fs::path dir = fs::temp_directory_path() / ("layup_memory_cal_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path calibration = dir / "calibration.json";
  const auto write_calibration = [&](int width) {
    std::ofstream(calibration) << R"({"layup_calibration": 1, "host": "box", "date": "today",
      "device": "cuda bf16",
      "gpu_shape": {"width": )" << width
                               << R"(, "batch": 4, "seq_len": 1024, "recompute": 0},
      "rates": {"gpu_flops": 4.8e14, "gpu_adamw_params_per_s": 1.2e11,
                "cpu_adamw_params_per_s": 3.4e9, "host_add_floats_per_s": 1e10,
                "d2h_bytes_per_s": 5e10, "h2d_bytes_per_s": 5e10}})";
  };
  write_calibration(1600);
  const std::string model = "memory --device cuda --model gpt2-xl --batch 4 --seq-len 1024 ";
  const Outcome predicted =
      run_layup(model + "--optimizer-placement host --calibration '" + calibration.string() + "'");
  ASSERT_EQ(predicted.exit_code, 0) << predicted.output;
  for (const char* expected :
       {"predicted step time (calibration",
        "box, today, cuda bf16 (FLOP rate at C=1600, B=4 x T=1024)", "  gpu  ", "  offload  ",
        "  layup  ", "bound by CPU", "layup mode:", "predicted step", "gradients to the host"})
    EXPECT_NE(predicted.output.find(expected), std::string::npos) << expected << "\n"
                                                                  << predicted.output;
  EXPECT_EQ(predicted.output.find("FLOP rate was measured at"), std::string::npos)
      << predicted.output;

  // A FLOP rate measured at another width: the prediction says so and how to measure this one.
  write_calibration(5120);
  const Outcome elsewhere =
      run_layup(model + "--optimizer-placement host --calibration '" + calibration.string() + "'");
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find("note: the FLOP rate was measured at C=5120, B=4 x T=1024, this "
                                  "run is C=1600, B=4 x T=1024"),
            std::string::npos)
      << elsewhere.output;

  const Outcome none = run_layup(model + "--calibration '" + (dir / "absent.json").string() + "'");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("no calibration in"), std::string::npos) << none.output;
  EXPECT_NE(none.output.find("run `layup calibrate`"), std::string::npos) << none.output;

  std::ofstream(calibration) << "{ not json";
  const Outcome corrupt = run_layup(model + "--calibration '" + calibration.string() + "'");
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
  EXPECT_NE(corrupt.output.find("is not a layup calibration"), std::string::npos) << corrupt.output;
  fs::remove_all(dir);
}

// `layup study` on the CPU backend writes its files and says what it skipped; `memory` and
// `train` read the plan it recommends (--plan), and a plan's placement is checked like --place.
TEST(MemoryCli, StudyWritesAPlanThatTrainAndMemoryRead) {
  REQUIRE_BINARY();
  const fs::path out = fs::temp_directory_path() / ("layup_study_cli_" + std::to_string(getpid()));
  fs::remove_all(out);
  const Outcome study = run_layup(
      "study --device cpu --model small --batch 2 --seq-len 32 --warmup 1 --steps 1 "
      "--out '" +
      out.string() + "'");
  ASSERT_EQ(study.exit_code, 0) << study.output;
  for (const char* file : {"study.json", "study.md", "best_plan.json", "placement_time.svg",
                           "placement_memory.svg", "modes.svg"})
    EXPECT_TRUE(fs::exists(out / file)) << file;
  EXPECT_NE(study.output.find("run 1 of about"), std::string::npos) << study.output;
  EXPECT_NE(study.output.find("refused: the CPU backend has only host memory"), std::string::npos)
      << study.output;
  EXPECT_NE(study.output.find("recommended: "), std::string::npos) << study.output;

  const Outcome memory = run_layup(
      "memory --device cpu --model small --seq-len 64 --mode layup "
      "--plan '" +
      (out / "best_plan.json").string() + "'");
  EXPECT_EQ(memory.exit_code, 0) << memory.output;
  EXPECT_NE(memory.output.find("placement (layup mode)"), std::string::npos) << memory.output;

  // A plan made for a GPU: train applies it as it would --place, so the CPU backend refuses it.
  const fs::path gpu_plan = out / "gpu_plan.json";
  std::ofstream(gpu_plan) << R"({"format": "layup-placement-plan", "version": 1,
                                 "place": ["grads=pinned"]})";
  const Outcome train = run_layup("train --device cpu --model small --plan '" + gpu_plan.string() +
                                  "' --out '" + (out / "run").string() + "'");
  EXPECT_NE(train.exit_code, 0);
  EXPECT_NE(train.output.find("--place grads=pinned is refused on cpu"), std::string::npos)
      << train.output;
  fs::remove_all(out);
}

}  // namespace
}  // namespace layup
