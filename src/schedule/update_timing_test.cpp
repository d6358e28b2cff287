// UpdateTiming: which timing each step gets, and what each timing does with a block.
#include "schedule/update_timing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace layup {
namespace {

TEST(UpdateTiming, EachStepGetsTheTimingItsThresholdCallsFor) {
  UpdateTiming deferring(/*speculative_clip=*/false);
  EXPECT_TRUE(deferring.begin_step(0.0f).during_backward()) << "no clipping";
  EXPECT_FALSE(deferring.begin_step(1.0f).during_backward()) << "deferred";

  UpdateTiming speculating(/*speculative_clip=*/true);
  EXPECT_TRUE(speculating.begin_step(1.0f).speculative());
  speculating.end_step(/*clipped=*/true);
  EXPECT_FALSE(speculating.begin_step(1.0f).during_backward()) << "deferred after a clipped step";
  EXPECT_FALSE(speculating.begin_step(0.0f).speculative()) << "no clipping: in place";
  speculating.end_step(/*clipped=*/false);
  EXPECT_TRUE(speculating.begin_step(1.0f).speculative());
}

TEST(UpdateTiming, SpeculationStopsOnceTheNormSoFarCallsForClipping) {
  UpdateTiming timing(/*speculative_clip=*/true);
  StepTiming& step = timing.begin_step(2.0f);  // clips past a sum of squares of 4
  EXPECT_TRUE(step.update_now(1.0));
  EXPECT_TRUE(step.update_now(2.5));
  EXPECT_FALSE(step.update_now(1.0)) << "4.5 > 4";
  EXPECT_FALSE(step.update_now(0.0)) << "and so for every block after";
  EXPECT_FALSE(timing.begin_step(2.0f).update_now(std::nan(""))) << "a non-finite block";
  EXPECT_TRUE(timing.begin_step(2.0f).update_now(3.0)) << "a new step starts from zero";

  EXPECT_EQ(step.after_norm(0, true, false), BlockUpdate::kDone);
  EXPECT_EQ(step.after_norm(0, true, true), BlockUpdate::kRedo);
  EXPECT_EQ(step.after_norm(0, false, true), BlockUpdate::kCatchUp);
}

TEST(UpdateTiming, UnclippedAndDeferredUpdateEveryBlockOnce) {
  UnclippedTiming unclipped;
  EXPECT_TRUE(unclipped.update_now(1e30));
  EXPECT_FALSE(unclipped.update_now(std::numeric_limits<double>::infinity()));
  EXPECT_EQ(unclipped.after_norm(2, true, false), BlockUpdate::kDone);
  EXPECT_THROW(unclipped.after_norm(2, false, false), Error) << "a block missed its update";

  DeferredTiming deferred;
  EXPECT_FALSE(deferred.update_now(1.0));
  EXPECT_EQ(deferred.after_norm(2, false, true), BlockUpdate::kNow);
  EXPECT_THROW(deferred.after_norm(2, true, true), Error) << "updated before the norm was known";
}

}  // namespace
}  // namespace layup
