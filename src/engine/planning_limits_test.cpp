// Planning does not grow with the batch: the largest batch that fits is found by bisection (the
// replans counted, not timed), a batch past the shape limits is refused naming --batch with the
// largest batch the memory holds, and a too-wide model names --dim before any plan is made.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/memory_planner.h"
#include "io/test_files.h"
#include "memory/memory_plan.h"
#include "model/shape_limits.h"

namespace layup {
namespace {

MemoryPlanRequest tiny_cpu_request(int batch, int seq_len) {
  MemoryPlanRequest request;
  request.config = gpt2_config(2, 2, 32, 64);
  request.model_name = "test";
  request.mode = Mode::kGpu;
  request.batch = batch;
  request.seq_len = seq_len;
  return request;
}

// A budget that the tiny model holds at some batches, not at all (on the CPU backend, gpu mode
// keeps the model and its activations on the device side).
MemoryBudgets tiny_budget(const std::string& device_budget = "64M") {
  return parse_memory_budgets("", device_budget, "");
}

using test_files::error_message;

// The batch after "--batch " in `message` that comes before `suffix`.
int batch_in(const std::string& message, const std::string& suffix) {
  const size_t end = message.find(suffix);
  if (end == std::string::npos) return -1;
  const size_t start = message.rfind("--batch ", end);
  if (start == std::string::npos) return -1;
  return std::stoi(message.substr(start + 8, end - start - 8));
}

TEST(PlanningLimits, TheLargestFittingBatchIsFoundInLogarithmicallyManyPlans) {
  const MemoryBudgets budgets = tiny_budget();
  int plans = 0;
  const Replan counted = [&plans](const MemoryPlanRequest& request) {
    ++plans;
    return plan_memory(request);
  };
  // Within the shape limits at T=1 (2e9 tokens), so that every batch below can be planned.
  const MemoryPlanRequest huge = tiny_cpu_request(2000000000, 1);
  const int batch = largest_fitting_batch(huge, budgets, counted);
  EXPECT_LE(plans, 32);
  ASSERT_GT(batch, 1);
  MemoryPlanRequest edge = tiny_cpu_request(batch, 1);
  EXPECT_TRUE(fits(plan_memory(edge), budgets));
  edge.batch += 1;
  EXPECT_FALSE(fits(plan_memory(edge), budgets));
  // Nothing fits: 0, still in a bounded number of plans.
  plans = 0;
  EXPECT_EQ(largest_fitting_batch(huge, parse_memory_budgets("", "1K", ""), counted), 0);
  EXPECT_LE(plans, 32);
}

TEST(PlanningLimits, ABatchOfAMillionIsRefusedWithTheBatchThatFits) {
  // Within the shape limits (16 million tokens), over the budget: check_budget's advice.
  const MemoryBudgets budgets = tiny_budget();
  const MemoryPlan plan = plan_memory(tiny_cpu_request(1000000, 16));
  int plans = 0;
  const std::string message = error_message([&] {
    check_budget(plan, budgets, [&plans](const MemoryPlanRequest& request) {
      ++plans;
      return plan_memory(request);
    });
  });
  // Three modes, a bisection each over the batch and over the sequence, and the alternatives.
  EXPECT_LE(plans, 100) << message;
  const int batch = batch_in(message, " (needs");
  ASSERT_GT(batch, 1) << message;
  EXPECT_TRUE(fits(plan_memory(tiny_cpu_request(batch, 16)), budgets));
  EXPECT_FALSE(fits(plan_memory(tiny_cpu_request(batch + 1, 16)), budgets));
}

TEST(PlanningLimits, ABatchPastTheShapeLimitsNamesBatchAndWhatFits) {
  // `bench --batch 2000000000`: past the backends' 32-bit token count at any sequence length.
  const MemoryBudgets budgets = tiny_budget("512M");
  const MemoryPlanRequest request = tiny_cpu_request(2000000000, 64);
  const std::string message = error_message([&] { check_run_shape(request, budgets); });
  EXPECT_NE(message.find("--batch 2000000000 is too large"), std::string::npos) << message;
  const int batch = batch_in(message, " or less, the largest that the memory limits hold");
  ASSERT_GT(batch, 1) << message;
  EXPECT_TRUE(fits(plan_memory(tiny_cpu_request(batch, 64)), budgets));
  EXPECT_FALSE(fits(plan_memory(tiny_cpu_request(batch + 1, 64)), budgets));
  // Without a budget that binds, the limit itself is the advice.
  const std::string unbounded = error_message([&] { check_run_shape(request, MemoryBudgets{}); });
  EXPECT_NE(unbounded.find("use --batch 33554431 or less"), std::string::npos) << unbounded;
  // plan_memory refuses it too, before sizing anything.
  EXPECT_NE(error_message([&] { plan_memory(request); }).find("--batch 2000000000"),
            std::string::npos);
}

TEST(PlanningLimits, AWideModelIsRefusedNamingDimBeforeAnyPlan) {
  MemoryPlanRequest request = tiny_cpu_request(32, 64);
  request.config = gpt2_config(2, 2, 2000000000, 1024);
  for (const std::string& message :
       {error_message([&] { check_run_shape(request, tiny_budget()); }),
        error_message([&] { plan_memory(request); })}) {
    EXPECT_NE(message.find("--dim 2000000000 is too large"), std::string::npos) << message;
    EXPECT_EQ(message.find("--batch"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace layup
