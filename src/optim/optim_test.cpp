// Pins AdamW against a scalar re-derivation, the LR schedule's shape, and the norm's determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "optim/adamw.h"
#include "optim/grad_norm.h"
#include "optim/lr_schedule.h"

namespace layup {
namespace {

TEST(AdamW, MatchesTheScalarFormulaOverSeveralSteps) {
  AdamWStep step;
  step.hyper = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const std::vector<float> grads = {0.5f, -1.5f, 1e-4f, 3.0f};
  std::vector<float> p = {0.1f, -0.2f, 0.3f, 0.0f}, m(4, 0.0f), v(4, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(4, 0.0), rv(4, 0.0);
  for (int t = 1; t <= 5; ++t) {
    step.t = t;
    step.grad_scale = 0.5f;
    adamw_update(p.data(), grads.data(), m.data(), v.data(), p.size(), step, true);
    for (int i = 0; i < 4; ++i) {
      const double g = grads[i] * 0.5;
      rp[i] *= 1.0 - 1e-2 * 0.1;
      rm[i] = 0.9 * rm[i] + 0.1 * g;
      rv[i] = 0.95 * rv[i] + 0.05 * g * g;
      const double mhat = rm[i] / (1 - std::pow(0.9, t)), vhat = rv[i] / (1 - std::pow(0.95, t));
      rp[i] -= 1e-2 * mhat / (std::sqrt(vhat) + 1e-8);
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], rp[i], 1e-6) << i;
}

TEST(AdamW, NoDecayLeavesZeroGradientParametersAlone) {
  AdamWStep step;
  step.hyper.lr = 1.0f;
  std::vector<float> p = {2.0f}, g = {0.0f}, m = {0.0f}, v = {0.0f};
  adamw_update(p.data(), g.data(), m.data(), v.data(), 1, step, false);
  EXPECT_EQ(p[0], 2.0f);
  adamw_update(p.data(), g.data(), m.data(), v.data(), 1, step, true);
  EXPECT_FLOAT_EQ(p[0], 2.0f * (1.0f - step.hyper.weight_decay));
}

TEST(LrSchedule, WarmsUpThenDecaysToTheFloor) {
  const LrSchedule schedule{1.0f, 0.1f, 4, 14};
  EXPECT_FLOAT_EQ(schedule.at(0), 0.25f);
  EXPECT_FLOAT_EQ(schedule.at(3), 1.0f);
  EXPECT_FLOAT_EQ(schedule.at(4), 1.0f);
  EXPECT_NEAR(schedule.at(9), 0.55f, 1e-6);  // halfway through the cosine
  EXPECT_FLOAT_EQ(schedule.at(14), 0.1f);
  for (int step = 4; step < 14; ++step) EXPECT_GE(schedule.at(step), schedule.at(step + 1));
}

TEST(GradNorm, SumOfSquaresIsExactAndThreadCountIndependent) {
  Rng rng(7);
  std::vector<float> x(300001);
  double expected = 0.0;
  for (float& value : x) {
    value = rng.normal();
  }
  for (float value : x) expected += static_cast<double>(value) * value;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = sum_of_squares(x.data(), x.size());
  omp_set_num_threads(2);
  const double two = sum_of_squares(x.data(), x.size());
  omp_set_num_threads(threads);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, expected, 1e-9 * expected);
}

// The pieces a schedule's workers compute (whole chunks, in any split, on any thread) add up to
// sum_of_squares bit for bit, and each piece is the chunk's plain sum in index order.
TEST(GradNorm, ChunkSumsAddUpToTheSumOfSquaresForAnySplit) {
  Rng rng(9);
  for (size_t count : {size_t{1}, size_t{65536}, size_t{65537}, size_t{11} * 65536 + 123}) {
    std::vector<float> x(count);
    for (float& value : x) value = rng.normal();
    const size_t chunks = sum_of_squares_chunks(count);
    std::vector<double> plain(chunks, 0.0);
    for (size_t i = 0; i < count; ++i)
      plain[i / kSumOfSquaresChunk] += static_cast<double>(x[i]) * x[i];
    for (size_t parts : {size_t{1}, size_t{2}, size_t{3}, size_t{7}}) {
      std::vector<double> sums(chunks, -1.0);
      for (size_t p = 0; p < parts; ++p)
        chunk_sums_of_squares(x.data(), count, chunks * p / parts, chunks * (p + 1) / parts,
                              sums.data());
      EXPECT_EQ(sums, plain) << count << " in " << parts;
      EXPECT_EQ(add_chunk_sums(sums.data(), chunks), sum_of_squares(x.data(), count)) << count;
    }
  }
}

TEST(GradNorm, ClipFactorFollowsTorch) {
  EXPECT_EQ(clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(clip_factor(4.0, 1.0f), 1.0 / (4.0 + 1e-6), 1e-7);
  EXPECT_EQ(clip_factor(1e9, 0.0f), 1.0f);  // no clipping
}

}  // namespace
}  // namespace layup
