// Softmax cross-entropy forward against a double-precision reference, backward against central
// finite differences of it; the padded columns are ignored by the loss and get exactly zero, and so
// do the rows whose target is not learned.
#include "backend/cpu/ops/classifier.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backend/cpu/ops/gradient_check.h"
#include "model/token_batch.h"

namespace layup {
namespace {

using namespace op_test;

// Per-row cross-entropy over the first V of Vp logits, in double; optionally the log-sum-exp.
std::vector<double> classifier_reference(const std::vector<double>& logits,
                                         const std::vector<int32_t>& targets, int N, int V, int Vp,
                                         std::vector<double>* lse = nullptr) {
  std::vector<double> losses(N);
  for (int n = 0; n < N; ++n) {
    const double* z = logits.data() + static_cast<size_t>(n) * Vp;
    double max = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; ++v) max = std::max(max, z[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - max);
    losses[n] = max + std::log(sum) - z[targets[n]];
    if (lse) lse->push_back(max + std::log(sum));
  }
  return losses;
}

struct ClassifierCase {
  int N, V, Vp;
};

class ClassifierOp : public ::testing::TestWithParam<ClassifierCase> {
 protected:
  void SetUp() override {
    const auto [N, V, Vp] = GetParam();
    Rng rng(50);
    logits = random_vector(rng, N * Vp, 3.0f);
    // Padding holds garbage that must not leak into the loss or the gradient.
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v)
        logits[n * Vp + v] = (v % 2) ? 1e30f : std::numeric_limits<float>::quiet_NaN();
    targets.resize(N);
    for (int32_t& target : targets) target = static_cast<int32_t>(rng.below(V));
    targets[0] = V - 1;  // the last real column
  }
  std::vector<float> logits;
  std::vector<int32_t> targets;
};

TEST_P(ClassifierOp, ForwardMatchesDoubleReference) {
  const auto [N, V, Vp] = GetParam();
  std::vector<float> losses(N), lse(N);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  std::vector<double> lse_expected;
  expect_close(losses, classifier_reference(to_double(logits), targets, N, V, Vp, &lse_expected),
               2e-6, 1e-7, "losses");
  expect_close(lse, lse_expected, 2e-6, 1e-7, "lse");
}

TEST_P(ClassifierOp, ForwardIsStableForLargeLogits) {
  const auto [N, V, Vp] = GetParam();
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) logits[n * Vp + v] += 1000.0f;
  std::vector<float> losses(N), lse(N);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  // Everything is computed relative to the row max, so the offset costs no accuracy.
  expect_close(losses, classifier_reference(to_double(logits), targets, N, V, Vp), 2e-6, 1e-7,
               "losses");
}

TEST_P(ClassifierOp, BackwardMatchesFiniteDifferencesAndZeroesPadding) {
  const auto [N, V, Vp] = GetParam();
  const float dloss = 0.7f / N;  // loss_scale / (B*T)
  std::vector<float> losses(N), lse(N), dlogits(N * Vp, 123.0f);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  classifier_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V, Vp, dloss);

  std::vector<double> logits_d = to_double(logits);
  auto objective = [&] {
    double sum = 0.0;
    for (double loss : classifier_reference(logits_d, targets, N, V, Vp)) sum += dloss * loss;
    return sum;
  };
  // Differentiate only the real columns (the reference never reads the padded ones).
  std::vector<double> expected(N * Vp, 0.0);
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      double& z = logits_d[n * Vp + v];
      const double saved = z, eps = 1e-5;
      z = saved + eps;
      const double plus_value = objective();
      z = saved - eps;
      const double minus_value = objective();
      z = saved;
      expected[n * Vp + v] = (plus_value - minus_value) / (2 * eps);
    }
  expect_close(dlogits, expected, 1e-9, 1e-5, "dlogits");
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v)
      ASSERT_EQ(dlogits[n * Vp + v], 0.0f) << "padded column " << v << " of row " << n;
}

TEST_P(ClassifierOp, BackwardInPlaceMatchesOutOfPlace) {
  const auto [N, V, Vp] = GetParam();
  std::vector<float> losses(N), lse(N), dlogits(N * Vp);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  classifier_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V, Vp, 0.25f);
  std::vector<float> in_place = logits;
  classifier_backward(in_place.data(), in_place.data(), lse.data(), targets.data(), N, V, Vp,
                      0.25f);
  EXPECT_EQ(in_place, dlogits);
}

// Vectorized loops have scalar remainders; no element may depend on which path the buffer's
// address or the thread split selects.
TEST_P(ClassifierOp, ResultDoesNotDependOnAlignmentOrThreadCount) {
  const auto [N, V, Vp] = GetParam();
  std::vector<float> losses(N), lse(N), dlogits(N * Vp);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  classifier_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V, Vp, 0.5f);
  const int threads = omp_get_max_threads();
  for (int offset : {1, 3, 6}) {
    for (int thread_count : {1, 3}) {
      omp_set_num_threads(thread_count);
      std::vector<float> shifted(N * Vp + offset), shifted_losses(N + offset),
          shifted_lse(N + offset), shifted_dlogits(N * Vp + offset);
      std::copy(logits.begin(), logits.end(), shifted.begin() + offset);
      classifier_forward(shifted_losses.data() + offset, shifted_lse.data() + offset,
                         shifted.data() + offset, targets.data(), N, V, Vp);
      classifier_backward(shifted_dlogits.data() + offset, shifted.data() + offset,
                          shifted_lse.data() + offset, targets.data(), N, V, Vp, 0.5f);
      const std::string where =
          "offset " + std::to_string(offset) + ", " + std::to_string(thread_count) + " threads";
      EXPECT_TRUE(std::equal(losses.begin(), losses.end(), shifted_losses.begin() + offset))
          << where;
      EXPECT_TRUE(std::equal(dlogits.begin(), dlogits.end(), shifted_dlogits.begin() + offset))
          << where;
    }
  }
  omp_set_num_threads(threads);
}

// A row whose target is below 0 is not learned: loss and lse 0, a gradient of exact zeros, and
// the other rows exactly as they are without it (its logits may hold anything, NaN included).
TEST_P(ClassifierOp, NotLearnedRowsGiveZeroAndLeaveTheOthersAlone) {
  const auto [N, V, Vp] = GetParam();
  std::vector<float> losses(N), lse(N), dlogits(N * Vp);
  classifier_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
  classifier_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), N, V, Vp, 0.5f);

  std::vector<int32_t> masked = targets;
  std::vector<float> poisoned = logits;
  for (int n = 0; n < N; n += 2) {
    masked[n] = n % 4 == 0 ? kNotLearned : -100;
    std::fill_n(poisoned.begin() + n * Vp, V, std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<float> masked_losses(N, 9.0f), masked_lse(N, 9.0f), masked_dlogits(N * Vp, 9.0f);
  classifier_forward(masked_losses.data(), masked_lse.data(), poisoned.data(), masked.data(), N, V,
                     Vp);
  classifier_backward(masked_dlogits.data(), poisoned.data(), masked_lse.data(), masked.data(), N,
                      V, Vp, 0.5f);
  for (int n = 0; n < N; ++n) {
    const bool learned = n % 2 == 1;
    EXPECT_EQ(masked_losses[n], learned ? losses[n] : 0.0f) << "row " << n;
    EXPECT_EQ(masked_lse[n], learned ? lse[n] : 0.0f) << "row " << n;
    for (int v = 0; v < Vp; ++v)
      ASSERT_EQ(masked_dlogits[n * Vp + v], learned ? dlogits[n * Vp + v] : 0.0f)
          << "row " << n << " column " << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ClassifierOp,
                         ::testing::Values(ClassifierCase{1, 1, 1}, ClassifierCase{1, 5, 5},
                                           ClassifierCase{3, 61, 128}, ClassifierCase{7, 130, 256},
                                           // several 1024-wide blocks, the last one partial
                                           ClassifierCase{2, 2500, 2560}));

}  // namespace
}  // namespace layup
