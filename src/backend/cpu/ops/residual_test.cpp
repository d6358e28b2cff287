// Residual add: the forward sums, the backward hands dout to both inputs, accumulating.
#include "backend/cpu/ops/residual.h"

#include <gtest/gtest.h>

#include "backend/cpu/ops/gradient_check.h"

namespace layup {
namespace {

using namespace op_test;

TEST(ResidualOp, ForwardSums) {
  for (int N : {1, 7, 1001}) {
    Rng rng(N);
    const std::vector<float> a = random_vector(rng, N), b = random_vector(rng, N);
    std::vector<float> out(N);
    residual_forward(out.data(), a.data(), b.data(), N);
    for (int i = 0; i < N; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << "N=" << N << " i=" << i;
  }
}

TEST(ResidualOp, BackwardAccumulatesIntoBothInputs) {
  for (int N : {1, 7, 1001}) {
    Rng rng(N);
    const std::vector<float> dout = random_vector(rng, N);
    const std::vector<float> da_initial = random_vector(rng, N), db_initial = random_vector(rng, N);
    std::vector<float> da = da_initial, db = db_initial;
    residual_backward(da.data(), db.data(), dout.data(), N);
    for (int i = 0; i < N; ++i) {
      ASSERT_EQ(da[i], da_initial[i] + dout[i]) << "N=" << N << " i=" << i;
      ASSERT_EQ(db[i], db_initial[i] + dout[i]) << "N=" << N << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace layup
