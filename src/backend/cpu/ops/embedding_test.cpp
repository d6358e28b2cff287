// Embedding forward against a direct sum; backward against a double-precision scatter.
#include "backend/cpu/ops/embedding.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

struct EmbeddingCase {
  int B, T, C, V;
};

class EmbeddingOp : public ::testing::TestWithParam<EmbeddingCase> {};

TEST_P(EmbeddingOp, ForwardAddsTokenAndPositionRows) {
  const auto [B, T, C, V] = GetParam();
  Rng rng(1);
  std::vector<int32_t> tokens(B * T);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(V));
  const std::vector<float> wte = random_vector(rng, V * C), wpe = random_vector(rng, (T + 2) * C);
  std::vector<float> out(B * T * C);
  embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        ASSERT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
}

TEST_P(EmbeddingOp, BackwardScattersAndAccumulates) {
  const auto [B, T, C, V] = GetParam();
  Rng rng(2);
  std::vector<int32_t> tokens(B * T);
  // Few distinct tokens, so most rows of dwte receive several positions.
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(std::min(V, 3)));
  const std::vector<float> dout = random_vector(rng, B * T * C);
  const std::vector<float> dwte_initial = random_vector(rng, V * C);
  const std::vector<float> dwpe_initial = random_vector(rng, T * C);

  std::vector<double> dwte_expected(dwte_initial.begin(), dwte_initial.end());
  std::vector<double> dwpe_expected(dwpe_initial.begin(), dwpe_initial.end());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        dwte_expected[tokens[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        dwpe_expected[t * C + c] += dout[(b * T + t) * C + c];
      }

  std::vector<float> dwte = dwte_initial, dwpe = dwpe_initial;
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  expect_close(dwte, dwte_expected, 5e-7, 5e-7, "dwte");
  expect_close(dwpe, dwpe_expected, 5e-7, 5e-7, "dwpe");
}

TEST_P(EmbeddingOp, BackwardIsTheSameForAnyThreadCount) {
  const auto [B, T, C, V] = GetParam();
  Rng rng(3);
  std::vector<int32_t> tokens(B * T);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(std::min(V, 2)));
  const std::vector<float> dout = random_vector(rng, B * T * C);
  const int threads = omp_get_max_threads();
  std::vector<float> dwte_one(V * C, 0.0f), dwpe_one(T * C, 0.0f);
  omp_set_num_threads(1);
  embedding_backward(dwte_one.data(), dwpe_one.data(), dout.data(), tokens.data(), B, T, C);
  std::vector<float> dwte_many(V * C, 0.0f), dwpe_many(T * C, 0.0f);
  omp_set_num_threads(3);
  embedding_backward(dwte_many.data(), dwpe_many.data(), dout.data(), tokens.data(), B, T, C);
  omp_set_num_threads(threads);
  EXPECT_EQ(dwte_one, dwte_many);
  EXPECT_EQ(dwpe_one, dwpe_many);
}

INSTANTIATE_TEST_SUITE_P(Sizes, EmbeddingOp,
                         ::testing::Values(EmbeddingCase{1, 1, 1, 1}, EmbeddingCase{1, 5, 13, 7},
                                           EmbeddingCase{3, 4, 13, 11},
                                           EmbeddingCase{4, 9, 40, 50}));

}  // namespace
}  // namespace layup
