// One harness for every CUDA op: each op runs forward and backward on random inputs of several
// shapes (odd sizes, T = 1, B = 1, misaligned buffers) in fp32 and in bf16, and is compared with
// the CPU op (the reference, backend/cpu/ops) on the same inputs. In bf16 the inputs are rounded
// to bf16 first, and the CPU op sees the rounded values, so what is measured is the op's own error.
//
// Limits (relative L2 error, cuda_test_support.h): 1e-5 in fp32, 1e-2 in bf16. Outputs an op writes
// are poisoned (all bits set: NaN) before it runs, so an element it fails to write fails the test;
// outputs it accumulates into start from the same random values on both sides.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <vector>

#include "backend/cpu/ops/attention.h"
#include "backend/cpu/ops/classifier.h"
#include "backend/cpu/ops/embedding.h"
#include "backend/cpu/ops/gelu.h"
#include "backend/cpu/ops/gradient_check.h"
#include "backend/cpu/ops/layernorm.h"
#include "backend/cpu/ops/matmul.h"
#include "backend/cpu/ops/residual.h"
#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/cuda/cuda_test_support.h"
#include "backend/cuda/ops/attention.cuh"
#include "backend/cuda/ops/attention_cudnn.cuh"
#include "backend/cuda/ops/cast.cuh"
#include "backend/cuda/ops/classifier.cuh"
#include "backend/cuda/ops/embedding.cuh"
#include "backend/cuda/ops/gelu.cuh"
#include "backend/cuda/ops/layernorm.cuh"
#include "backend/cuda/ops/matmul.cuh"
#include "backend/cuda/ops/residual.cuh"
#include "core/rng.h"
#include "model/token_batch.h"

namespace layup {
namespace {

using namespace cuda_test;
using op_test::random_vector;

// The ops run on the legacy default stream; every download is a synchronizing cudaMemcpy.
constexpr cudaStream_t kStream = nullptr;

std::vector<int32_t> random_tokens(Rng& rng, int count, int vocabulary) {
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = static_cast<int32_t>(rng.below(vocabulary));
  return tokens;
}

template <class U>
bool bitwise_equal(const std::vector<U>& a, const std::vector<U>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(U)) == 0;
}

// ---- GELU and residual ------------------------------------------------------------------------

struct ElementwiseCase {
  int N;
  size_t offset;  // elements past an aligned allocation
};

void PrintTo(const ElementwiseCase& c, std::ostream* os) {
  *os << "N" << c.N << "_offset" << c.offset;
}

class ElementwiseOps : public ::testing::TestWithParam<ElementwiseCase> {};

template <class T>
void check_gelu(int N, size_t offset) {
  Rng rng(N + 1);
  const std::vector<float> x = rounded<T>(random_vector(rng, N, 2.0f));
  std::vector<float> expected(N);
  gelu_forward(expected.data(), x.data(), N);
  DeviceTensor<T> inp(x, offset), out(N, offset);
  out.array.poison();
  cuda::gelu_forward(out.get(), inp.get(), N, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), expected, {}, tolerance<T>(), "gelu out");

  const std::vector<float> dout = rounded<T>(random_vector(rng, N));
  const std::vector<float> dinp_initial = rounded<T>(random_vector(rng, N));
  std::vector<float> dinp_expected = dinp_initial;
  gelu_backward(dinp_expected.data(), x.data(), dout.data(), N);
  DeviceTensor<T> d_out(dout, offset), d_inp(dinp_initial, offset);
  cuda::gelu_backward(d_inp.get(), inp.get(), d_out.get(), N, kStream);
  LAYUP_EXPECT_RELATIVE(d_inp.floats(), dinp_expected, accumulator_baseline<T>(dinp_initial),
                        tolerance<T>(), "gelu dinp");
}

template <class T>
void check_residual(int N, size_t offset) {
  Rng rng(N + 2);
  const std::vector<float> a = rounded<T>(random_vector(rng, N));
  const std::vector<float> b = rounded<T>(random_vector(rng, N));
  std::vector<float> expected(N);
  residual_forward(expected.data(), a.data(), b.data(), N);
  DeviceTensor<T> d_a(a, offset), d_b(b, offset), out(N, offset);
  out.array.poison();
  cuda::residual_forward(out.get(), d_a.get(), d_b.get(), N, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), expected, {}, tolerance<T>(), "residual out");

  const std::vector<float> dout = rounded<T>(random_vector(rng, N));
  const std::vector<float> da_initial = rounded<T>(random_vector(rng, N));
  const std::vector<float> db_initial = rounded<T>(random_vector(rng, N));
  std::vector<float> da_expected = da_initial, db_expected = db_initial;
  residual_backward(da_expected.data(), db_expected.data(), dout.data(), N);
  DeviceTensor<T> d_out(dout, offset), d_da(da_initial, offset), d_db(db_initial, offset);
  cuda::residual_backward(d_da.get(), d_db.get(), d_out.get(), N, kStream);
  LAYUP_EXPECT_RELATIVE(d_da.floats(), da_expected, accumulator_baseline<T>(da_initial),
                        tolerance<T>(), "residual dinp1");
  LAYUP_EXPECT_RELATIVE(d_db.floats(), db_expected, accumulator_baseline<T>(db_initial),
                        tolerance<T>(), "residual dinp2");
}

TEST_P(ElementwiseOps, GeluMatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_gelu, GetParam().N, GetParam().offset);
}

TEST_P(ElementwiseOps, ResidualMatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_residual, GetParam().N, GetParam().offset);
}

// fp32 -> bf16 must round exactly as the host conversion does (to nearest even).
TEST_P(ElementwiseOps, CastToBf16RoundsLikeTheHost) {
  LAYUP_REQUIRE_GPU();
  const auto [N, offset] = GetParam();
  Rng rng(N + 3);
  std::vector<float> values = random_vector(rng, N, 10.0f);
  if (N > 2) values[1] = std::numeric_limits<float>::infinity();
  DeviceArray<float> inp(values, offset);
  DeviceArray<__nv_bfloat16> out(N, offset);
  out.poison();
  cuda::cast_to_bf16(out.get(), inp.get(), N, kStream);
  const std::vector<__nv_bfloat16> result = out.download();
  const std::vector<__nv_bfloat16> expected = convert<__nv_bfloat16>(values);
  EXPECT_TRUE(bitwise_equal(result, expected));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ElementwiseOps,
                         ::testing::Values(ElementwiseCase{1, 0}, ElementwiseCase{7, 0},
                                           ElementwiseCase{8, 0}, ElementwiseCase{1001, 0},
                                           ElementwiseCase{4099, 1}, ElementwiseCase{65536, 0},
                                           ElementwiseCase{65536 + 13, 3}));

// ---- Embedding --------------------------------------------------------------------------------

struct EmbeddingCase {
  int B, T, C, V;  // small V: many positions share a token
};

void PrintTo(const EmbeddingCase& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_C" << c.C << "_V" << c.V;
}

class EmbeddingOp : public ::testing::TestWithParam<EmbeddingCase> {};

template <class T>
void check_embedding(const EmbeddingCase& shape) {
  const auto [B, T_, C, V] = shape;
  const int BT = B * T_, P = T_ + 3;  // wpe has more rows than the batch uses
  Rng rng(B * 1000 + T_ * 10 + C);
  const std::vector<int32_t> tokens = random_tokens(rng, BT, V);
  const std::vector<float> wte = rounded<T>(random_vector(rng, V * C));
  const std::vector<float> wpe = rounded<T>(random_vector(rng, P * C));
  std::vector<float> expected(BT * C);
  embedding_forward(expected.data(), tokens.data(), wte.data(), wpe.data(), B, T_, C);

  DeviceArray<int32_t> d_tokens(tokens);
  DeviceTensor<T> d_wte(wte), d_wpe(wpe), out(BT * C);
  out.array.poison();
  cuda::embedding_forward(out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T_, C, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), expected, {}, tolerance<T>(), "embedding out");

  const std::vector<float> dout = rounded<T>(random_vector(rng, BT * C));
  const std::vector<float> dwte_initial = random_vector(rng, V * C);
  const std::vector<float> dwpe_initial = random_vector(rng, P * C);
  std::vector<float> dwte_expected = dwte_initial, dwpe_expected = dwpe_initial;
  embedding_backward(dwte_expected.data(), dwpe_expected.data(), dout.data(), tokens.data(), B, T_,
                     C);

  const cuda::EmbeddingBackwardPlan plan = cuda::make_embedding_backward_plan(tokens.data(), BT);
  DeviceArray<int32_t> positions(plan.positions), starts(plan.segment_start);
  DeviceArray<int32_t> segment_tokens(plan.segment_token);
  DeviceTensor<T> d_out(dout);
  std::vector<float> first_dwte;
  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> dwte(dwte_initial), dwpe(dwpe_initial);
    cuda::embedding_backward(dwte.get(), dwpe.get(), d_out.get(), positions.get(), starts.get(),
                             segment_tokens.get(), plan.segments(), B, T_, C, kStream);
    const std::vector<float> dwte_result = dwte.download();
    LAYUP_EXPECT_RELATIVE(dwte_result, dwte_expected, dwte_initial, tolerance<T>(),
                          "embedding dwte");
    LAYUP_EXPECT_RELATIVE(dwpe.download(), dwpe_expected, dwpe_initial, tolerance<T>(),
                          "embedding dwpe");
    if (run == 0)
      first_dwte = dwte_result;
    else
      EXPECT_TRUE(bitwise_equal(first_dwte, dwte_result)) << "dwte is not reproducible";
  }
}

TEST_P(EmbeddingOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_embedding, GetParam());
}

TEST(EmbeddingPlan, GroupsPositionsByTokenInOrder) {
  const std::vector<int32_t> tokens = {5, 2, 5, 9, 2, 5};
  const cuda::EmbeddingBackwardPlan plan = cuda::make_embedding_backward_plan(tokens.data(), 6);
  EXPECT_EQ(plan.segment_token, (std::vector<int32_t>{2, 5, 9}));
  EXPECT_EQ(plan.segment_start, (std::vector<int32_t>{0, 2, 5, 6}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{1, 4, 0, 2, 5, 3}));
}

INSTANTIATE_TEST_SUITE_P(Sizes, EmbeddingOp,
                         ::testing::Values(EmbeddingCase{1, 1, 8, 5}, EmbeddingCase{2, 7, 13, 11},
                                           EmbeddingCase{3, 5, 64, 4}, EmbeddingCase{4, 64, 96, 50},
                                           EmbeddingCase{2, 33, 768, 1000}));

// ---- Layer norm -------------------------------------------------------------------------------

struct LayerNormCase {
  int N, C;
};

void PrintTo(const LayerNormCase& c, std::ostream* os) {
  *os << "N" << c.N << "_C" << c.C;
}

class LayerNormOp : public ::testing::TestWithParam<LayerNormCase> {};

template <class T>
void check_layernorm(const LayerNormCase& shape) {
  const auto [N, C] = shape;
  constexpr float kEps = 1e-5f;
  Rng rng(N * 100 + C);
  // An offset mean makes a one-pass variance cancel badly; the op must not.
  const std::vector<float> x = rounded<T>(random_vector(rng, N * C, 2.0f, 30.0f));
  const std::vector<float> w = rounded<T>(random_vector(rng, C, 0.3f, 1.0f));
  const std::vector<float> b = rounded<T>(random_vector(rng, C));
  std::vector<float> out_expected(N * C), mean_expected(N), rstd_expected(N);
  layernorm_forward(out_expected.data(), mean_expected.data(), rstd_expected.data(), x.data(),
                    w.data(), b.data(), N, C, kEps);

  DeviceTensor<T> d_x(x), d_w(w), d_b(b), out(N * C);
  DeviceArray<float> mean(N), rstd(N);
  out.array.poison();
  mean.poison();
  rstd.poison();
  cuda::layernorm_forward(out.get(), mean.get(), rstd.get(), d_x.get(), d_w.get(), d_b.get(), N, C,
                          kEps, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "layernorm out");
  LAYUP_EXPECT_RELATIVE(mean.download(), mean_expected, {}, tolerance<T>(), "layernorm mean");
  LAYUP_EXPECT_RELATIVE(rstd.download(), rstd_expected, {}, tolerance<T>(), "layernorm rstd");

  // Backward on its own: both sides get the CPU's saved statistics.
  const std::vector<float> x2 = rounded<T>(random_vector(rng, N * C, 1.5f, 0.5f));
  std::vector<float> unused(N * C), mean2(N), rstd2(N);
  layernorm_forward(unused.data(), mean2.data(), rstd2.data(), x2.data(), w.data(), b.data(), N, C,
                    kEps);
  const std::vector<float> dout = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> dx_initial = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> dw_initial = random_vector(rng, C), db_initial = random_vector(rng, C);
  std::vector<float> dx_expected = dx_initial, dw_expected = dw_initial, db_expected = db_initial;
  layernorm_backward(dx_expected.data(), dw_expected.data(), db_expected.data(), dout.data(),
                     x2.data(), w.data(), mean2.data(), rstd2.data(), N, C);

  DeviceTensor<T> d_x2(x2), d_dout(dout);
  DeviceArray<float> d_mean2(mean2), d_rstd2(rstd2);
  DeviceArray<float> scratch(cuda::layernorm_backward_scratch_floats(N, C));
  std::vector<float> first_dw;
  for (int run = 0; run < 2; ++run) {
    DeviceTensor<T> dx(dx_initial);
    DeviceArray<float> dw(dw_initial), db(db_initial);
    cuda::layernorm_backward(dx.get(), dw.get(), db.get(), d_dout.get(), d_x2.get(), d_w.get(),
                             d_mean2.get(), d_rstd2.get(), N, C, cuda::WeightGradient::kAccumulate,
                             scratch.get(), kStream);
    LAYUP_EXPECT_RELATIVE(dx.floats(), dx_expected, accumulator_baseline<T>(dx_initial),
                          tolerance<T>(), "layernorm dinp");
    const std::vector<float> dw_result = dw.download();
    LAYUP_EXPECT_RELATIVE(dw_result, dw_expected, dw_initial, tolerance<T>(), "layernorm dweight");
    LAYUP_EXPECT_RELATIVE(db.download(), db_expected, db_initial, tolerance<T>(),
                          "layernorm dbias");
    if (run == 0)
      first_dw = dw_result;
    else
      EXPECT_TRUE(bitwise_equal(first_dw, dw_result)) << "dweight is not reproducible";
  }

  // Overwriting the weight gradients (what the model's backward asks): they start poisoned.
  std::vector<float> dx_unused(N * C, 0.0f), dw_alone(C, 0.0f), db_alone(C, 0.0f);
  layernorm_backward(dx_unused.data(), dw_alone.data(), db_alone.data(), dout.data(), x2.data(),
                     w.data(), mean2.data(), rstd2.data(), N, C);
  DeviceTensor<T> dx(dx_initial);
  DeviceArray<float> dw(C), db(C);
  dw.poison();
  db.poison();
  cuda::layernorm_backward(dx.get(), dw.get(), db.get(), d_dout.get(), d_x2.get(), d_w.get(),
                           d_mean2.get(), d_rstd2.get(), N, C, cuda::WeightGradient::kOverwrite,
                           scratch.get(), kStream);
  LAYUP_EXPECT_RELATIVE(dw.download(), dw_alone, {}, tolerance<T>(), "layernorm dweight overwrite");
  LAYUP_EXPECT_RELATIVE(db.download(), db_alone, {}, tolerance<T>(), "layernorm dbias overwrite");
}

TEST_P(LayerNormOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_layernorm, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sizes, LayerNormOp,
                         ::testing::Values(LayerNormCase{1, 3}, LayerNormCase{5, 13},
                                           LayerNormCase{7, 64}, LayerNormCase{33, 37},
                                           LayerNormCase{9, 24}, LayerNormCase{300, 768},
                                           LayerNormCase{64, 1600}));

// The fused residual add + layer norm of the forward: the sum as residual_forward rounds it, and
// the layer norm of that sum, against the CPU ops.
template <class T>
void check_residual_layernorm(const LayerNormCase& shape) {
  const auto [N, C] = shape;
  constexpr float kEps = 1e-5f;
  Rng rng(N * 31 + C);
  const std::vector<float> x = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> branch = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> w = rounded<T>(random_vector(rng, C));
  const std::vector<float> b = rounded<T>(random_vector(rng, C));
  std::vector<float> sum(N * C), out_expected(N * C), mean_expected(N), rstd_expected(N);
  residual_forward(sum.data(), x.data(), branch.data(), N * C);
  sum = rounded<T>(sum);
  layernorm_forward(out_expected.data(), mean_expected.data(), rstd_expected.data(), sum.data(),
                    w.data(), b.data(), N, C, kEps);

  DeviceTensor<T> d_x(x), d_branch(branch), d_w(w), d_b(b), d_sum(N * C), out(N * C);
  DeviceArray<float> mean(N), rstd(N);
  d_sum.array.poison();
  out.array.poison();
  mean.poison();
  rstd.poison();
  cuda::residual_layernorm_forward(d_sum.get(), out.get(), mean.get(), rstd.get(), d_x.get(),
                                   d_branch.get(), d_w.get(), d_b.get(), N, C, kEps, kStream);
  LAYUP_EXPECT_RELATIVE(d_sum.floats(), sum, {}, tolerance<T>(), "fused residual sum");
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "fused layernorm out");
  LAYUP_EXPECT_RELATIVE(mean.download(), mean_expected, {}, tolerance<T>(), "fused layernorm mean");
  LAYUP_EXPECT_RELATIVE(rstd.download(), rstd_expected, {}, tolerance<T>(), "fused layernorm rstd");
}

TEST_P(LayerNormOp, FusedWithResidualMatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_residual_layernorm, GetParam());
}

// ---- Matmul -----------------------------------------------------------------------------------

struct MatmulCase {
  int N, IC, OC;
  bool bias;
  size_t offset;  // > 0: every buffer misaligned (the unaligned-bias path and cuBLASLt's
                  // alignment preferences)
};

void PrintTo(const MatmulCase& c, std::ostream* os) {
  *os << "N" << c.N << "_IC" << c.IC << "_OC" << c.OC << (c.bias ? "_bias" : "") << "_offset"
      << c.offset;
}

class MatmulOp : public ::testing::TestWithParam<MatmulCase> {};

template <class T>
void check_matmul(const MatmulCase& shape, AlgorithmChoice algorithms) {
  const auto [N, IC, OC, has_bias, offset] = shape;
  Rng rng(N * 10000 + IC * 100 + OC);
  const std::vector<float> x = rounded<T>(random_vector(rng, N * IC));
  const std::vector<float> w = rounded<T>(random_vector(rng, OC * IC));
  const std::vector<float> b = rounded<T>(random_vector(rng, OC));
  std::vector<float> expected(N * OC);
  matmul_forward(expected.data(), x.data(), w.data(), has_bias ? b.data() : nullptr, N, IC, OC);

  DeviceArray<char> workspace(kCublasLtWorkspaceBytes);
  cuda::CublasLt blas(workspace.get(), kCublasLtWorkspaceBytes, algorithms);
  DeviceTensor<T> d_x(x, offset), d_w(w, offset), d_b(b, offset), out(N * OC, offset);
  out.array.poison();
  cuda::matmul_forward(blas, out.get(), d_x.get(), d_w.get(), has_bias ? d_b.get() : nullptr, N, IC,
                       OC, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), expected, {}, tolerance<T>(), "matmul out");

  const std::vector<float> dout = rounded<T>(random_vector(rng, N * OC));
  const std::vector<float> dx_initial = rounded<T>(random_vector(rng, N * IC));
  const std::vector<float> dw_initial = random_vector(rng, OC * IC);
  const std::vector<float> db_initial = random_vector(rng, OC);
  std::vector<float> dx_expected = dx_initial, dw_expected = dw_initial, db_expected = db_initial;
  matmul_backward(dx_expected.data(), dw_expected.data(), has_bias ? db_expected.data() : nullptr,
                  dout.data(), x.data(), w.data(), N, IC, OC);

  DeviceTensor<T> d_dout(dout, offset), dx(dx_initial, offset);
  DeviceArray<float> dw(dw_initial, offset), db(db_initial, offset);
  DeviceArray<float> scratch(cuda::matmul_backward_scratch_floats(N, OC));
  cuda::matmul_backward(blas, dx.get(), dw.get(), has_bias ? db.get() : nullptr, d_dout.get(),
                        d_x.get(), d_w.get(), N, IC, OC, scratch.get(),
                        cuda::InputGradient::kAccumulate, cuda::WeightGradient::kAccumulate,
                        kStream);
  LAYUP_EXPECT_RELATIVE(dx.floats(), dx_expected, accumulator_baseline<T>(dx_initial),
                        tolerance<T>(), "matmul dinp");

  // Overwriting: dinp, dweight and dbias start poisoned and must come out as the products alone.
  std::vector<float> dx_alone(N * IC, 0.0f), dw_alone(OC * IC, 0.0f), db_alone(OC, 0.0f);
  matmul_backward(dx_alone.data(), dw_alone.data(), has_bias ? db_alone.data() : nullptr,
                  dout.data(), x.data(), w.data(), N, IC, OC);
  DeviceTensor<T> dx_fresh(N * IC, offset);
  DeviceArray<float> dw_fresh(OC * IC, offset), db_fresh(OC, offset);
  dx_fresh.array.poison();
  dw_fresh.poison();
  db_fresh.poison();
  cuda::matmul_backward(blas, dx_fresh.get(), dw_fresh.get(), has_bias ? db_fresh.get() : nullptr,
                        d_dout.get(), d_x.get(), d_w.get(), N, IC, OC, scratch.get(),
                        cuda::InputGradient::kOverwrite, cuda::WeightGradient::kOverwrite, kStream);
  LAYUP_EXPECT_RELATIVE(dx_fresh.floats(), dx_alone, {}, tolerance<T>(), "matmul dinp overwrite");
  LAYUP_EXPECT_RELATIVE(dw_fresh.download(), dw_alone, {}, tolerance<T>(),
                        "matmul dweight overwrite");
  if (has_bias)
    LAYUP_EXPECT_RELATIVE(db_fresh.download(), db_alone, {}, tolerance<T>(),
                          "matmul dbias overwrite");
  LAYUP_EXPECT_RELATIVE(dw.download(), dw_expected, dw_initial, tolerance<T>(), "matmul dweight");
  if (has_bias)
    LAYUP_EXPECT_RELATIVE(db.download(), db_expected, db_initial, tolerance<T>(), "matmul dbias");
  else
    EXPECT_TRUE(bitwise_equal(db.download(), db_initial)) << "dbias changed without a bias";
}

TEST_P(MatmulOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_matmul, GetParam(), AlgorithmChoice::kHeuristic);
}

// --algorithms timed: the trials overwrite the output before the product that counts, and
// a product that adds into its output (beta 1) is never tried twice.
TEST_P(MatmulOp, TimedAlgorithmsMatchCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_matmul, GetParam(), AlgorithmChoice::kTimed);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, MatmulOp,
    ::testing::Values(MatmulCase{1, 1, 1, true, 0}, MatmulCase{1, 3, 5, true, 0},
                      MatmulCase{7, 13, 11, true, 0}, MatmulCase{37, 19, 70, true, 0},
                      MatmulCase{70, 5, 3, false, 0}, MatmulCase{9, 24, 67, false, 0},
                      MatmulCase{128, 64, 192, true, 0}, MatmulCase{257, 96, 384, true, 0},
                      MatmulCase{37, 19, 70, true, 1}, MatmulCase{128, 64, 192, true, 3},
                      MatmulCase{64, 64, 1000, false, 0}));

// ---- Matmul with GELU in cuBLASLt's epilogue (the bf16 mode's MLP) ---------------------------

struct GeluMatmulCase {
  int N, IC, OC;  // the first MLP layer: [N,IC] -> [N,OC], OC a multiple of 8
};

void PrintTo(const GeluMatmulCase& c, std::ostream* os) {
  *os << "N" << c.N << "_IC" << c.IC << "_OC" << c.OC;
}

class GeluMatmulOp : public ::testing::TestWithParam<GeluMatmulCase> {};

// matmul_gelu_forward against the CPU's matmul then GELU; matmul_backward_through_gelu (the next
// layer's backward, [N,OC] -> [N,IC2]) against the CPU's matmul backward then GELU backward.
template <class T>
void check_gelu_matmul(const GeluMatmulCase& shape, AlgorithmChoice algorithms) {
  const auto [N, IC, OC] = shape;
  const int IC2 = 5;  // the next layer's output width (any)
  Rng rng(N * 7 + IC * 3 + OC);
  const std::vector<float> x = rounded<T>(random_vector(rng, N * IC));
  const std::vector<float> w = rounded<T>(random_vector(rng, OC * IC));
  const std::vector<float> b = rounded<T>(random_vector(rng, OC));
  std::vector<float> pre_expected(N * OC), out_expected(N * OC);
  matmul_forward(pre_expected.data(), x.data(), w.data(), b.data(), N, IC, OC);
  gelu_forward(out_expected.data(), pre_expected.data(), N * OC);

  DeviceArray<char> workspace(kCublasLtWorkspaceBytes);
  cuda::CublasLt blas(workspace.get(), kCublasLtWorkspaceBytes, algorithms);
  DeviceTensor<T> d_x(x), d_w(w), d_b(b), pre(N * OC), out(N * OC);
  pre.array.poison();
  out.array.poison();
  cuda::matmul_gelu_forward(blas, out.get(), pre.get(), d_x.get(), d_w.get(), d_b.get(), N, IC, OC,
                            kStream);
  LAYUP_EXPECT_RELATIVE(pre.floats(), pre_expected, {}, tolerance<T>(), "fused pre-GELU");
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "fused GELU output");

  // Next layer: y [N,IC2] = gelu(pre) w2^T + b2. Its backward through the GELU, from the CPU's
  // pre-activation rounded to T (what the device stored).
  const std::vector<float> pre_used = rounded<T>(pre_expected);
  std::vector<float> act(N * OC);
  gelu_forward(act.data(), pre_used.data(), N * OC);
  act = rounded<T>(act);
  const std::vector<float> w2 = rounded<T>(random_vector(rng, IC2 * OC));
  const std::vector<float> dy = rounded<T>(random_vector(rng, N * IC2));
  std::vector<float> d_act(N * OC, 0.0f), d_pre_expected(N * OC, 0.0f);
  std::vector<float> dw2_expected(IC2 * OC, 0.0f), db2_expected(IC2, 0.0f);
  matmul_backward(d_act.data(), dw2_expected.data(), db2_expected.data(), dy.data(), act.data(),
                  w2.data(), N, OC, IC2);
  gelu_backward(d_pre_expected.data(), pre_used.data(), d_act.data(), N * OC);

  DeviceTensor<T> d_pre_used(pre_used), d_act_in(act), d_w2(w2), d_dy(dy), d_pre(N * OC);
  // Overwriting (what the model's backward asks): every output starts poisoned. Then once more,
  // accumulating onto that result: twice the gradient.
  DeviceArray<float> dw2(IC2 * OC), db2(IC2);
  DeviceArray<float> scratch(cuda::matmul_backward_scratch_floats(N, IC2));
  d_pre.array.poison();
  dw2.poison();
  db2.poison();
  cuda::matmul_backward_through_gelu(blas, d_pre.get(), dw2.get(), db2.get(), d_dy.get(),
                                     d_act_in.get(), d_pre_used.get(), d_w2.get(), N, OC, IC2,
                                     scratch.get(), cuda::WeightGradient::kOverwrite, kStream);
  LAYUP_EXPECT_RELATIVE(d_pre.floats(), d_pre_expected, {}, tolerance<T>(), "fused dGELU input");
  LAYUP_EXPECT_RELATIVE(dw2.download(), dw2_expected, {}, tolerance<T>(), "fused dGELU dweight");
  LAYUP_EXPECT_RELATIVE(db2.download(), db2_expected, {}, tolerance<T>(), "fused dGELU dbias");
  cuda::matmul_backward_through_gelu(blas, d_pre.get(), dw2.get(), db2.get(), d_dy.get(),
                                     d_act_in.get(), d_pre_used.get(), d_w2.get(), N, OC, IC2,
                                     scratch.get(), cuda::WeightGradient::kAccumulate, kStream);
  for (float& value : dw2_expected) value *= 2.0f;
  for (float& value : db2_expected) value *= 2.0f;
  LAYUP_EXPECT_RELATIVE(dw2.download(), dw2_expected, {}, tolerance<T>(),
                        "fused dGELU dweight, accumulated");
  LAYUP_EXPECT_RELATIVE(db2.download(), db2_expected, {}, tolerance<T>(),
                        "fused dGELU dbias, accumulated");
}

TEST_P(GeluMatmulOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  // bf16 only: the fp32 mode keeps the separate GELU op (cuda_backend.cu says why).
  check_gelu_matmul<__nv_bfloat16>(GetParam(), AlgorithmChoice::kHeuristic);
}

TEST_P(GeluMatmulOp, TimedAlgorithmsMatchCpu) {
  LAYUP_REQUIRE_GPU();
  check_gelu_matmul<__nv_bfloat16>(GetParam(), AlgorithmChoice::kTimed);
}

INSTANTIATE_TEST_SUITE_P(Sizes, GeluMatmulOp,
                         ::testing::Values(GeluMatmulCase{1, 3, 8}, GeluMatmulCase{7, 13, 16},
                                           GeluMatmulCase{37, 19, 72},
                                           GeluMatmulCase{256, 64, 256}));

// ---- Attention --------------------------------------------------------------------------------

// heads == kv_heads is GPT-2's multi-head attention; fewer kv_heads, the Llama family's grouped
// query attention.
struct AttentionCase {
  int B, T, heads, kv_heads, head_dim;
  cuda::AttentionShape shape() const { return {B, T, heads, kv_heads, head_dim}; }
};

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_heads" << c.heads << "_kv" << c.kv_heads << "_hd"
      << c.head_dim;
}

class AttentionOp : public ::testing::TestWithParam<AttentionCase> {};

// lse [B,heads,T] of the causal score rows, in double; query head h reads key head
// h / (heads / kv_heads).
std::vector<float> attention_lse_reference(const std::vector<float>& qkv,
                                           const cuda::AttentionShape& shape) {
  const auto [B, T_, heads, kv_heads, hd] = shape;
  const size_t width = shape.qkv_width();
  const int group = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<float> lse(static_cast<size_t>(B) * heads * T_);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < T_; ++t) {
        const float* q = &qkv[(static_cast<size_t>(b) * T_ + t) * width + h * hd];
        std::vector<double> scores(t + 1);
        double max = -INFINITY, sum = 0.0;
        for (int u = 0; u <= t; ++u) {
          const float* k =
              &qkv[(static_cast<size_t>(b) * T_ + u) * width + (heads + h / group) * hd];
          double dot = 0.0;
          for (int i = 0; i < hd; ++i) dot += static_cast<double>(q[i]) * k[i];
          scores[u] = dot * scale;
          max = std::max(max, scores[u]);
        }
        for (double score : scores) sum += std::exp(score - max);
        lse[(static_cast<size_t>(b) * heads + h) * T_ + t] =
            static_cast<float>(max + std::log(sum));
      }
  return lse;
}

template <class T>
void check_attention(const AttentionCase& c) {
  const cuda::AttentionShape shape = c.shape();
  const auto [B, T_, heads, kv_heads, hd] = shape;
  Rng rng(B * 1000 + T_ * 10 + heads * hd + kv_heads);
  const size_t BT = static_cast<size_t>(B) * T_;
  const size_t qkv_size = BT * shape.qkv_width(), out_size = BT * shape.out_width();
  const std::vector<float> qkv = rounded<T>(random_vector(rng, qkv_size));
  std::vector<float> out_expected(out_size), att(static_cast<size_t>(B) * heads * T_ * T_);
  grouped_query_attention_forward(out_expected.data(), att.data(), qkv.data(), B, T_, heads,
                                  kv_heads, hd);

  DeviceTensor<T> d_qkv(qkv), out(out_size);
  DeviceArray<float> lse(static_cast<size_t>(B) * heads * T_);
  out.array.poison();
  lse.poison();
  cuda::attention_forward(out.get(), lse.get(), d_qkv.get(), shape, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "attention out");
  LAYUP_EXPECT_RELATIVE(lse.download(), attention_lse_reference(qkv, shape), {}, tolerance<T>(),
                        "attention lse");

  const std::vector<float> dout = rounded<T>(random_vector(rng, out_size));
  const std::vector<float> dqkv_initial = rounded<T>(random_vector(rng, qkv_size));
  std::vector<float> dqkv_expected = dqkv_initial;
  grouped_query_attention_backward(dqkv_expected.data(), dout.data(), qkv.data(), att.data(), B, T_,
                                   heads, kv_heads, hd);

  DeviceTensor<T> d_dout(dout);
  DeviceArray<float> scratch(cuda::attention_backward_scratch_floats(B, T_, heads));
  std::vector<T> first_dqkv;
  for (int run = 0; run < 2; ++run) {
    DeviceTensor<T> dqkv(dqkv_initial);
    cuda::attention_backward(dqkv.get(), d_dout.get(), d_qkv.get(), out.get(), lse.get(), shape,
                             scratch.get(), kStream);
    const std::vector<T> result = dqkv.array.download();
    LAYUP_EXPECT_RELATIVE(to_floats(result), dqkv_expected, accumulator_baseline<T>(dqkv_initial),
                          tolerance<T>(), "attention dqkv");
    if (run == 0)
      first_dqkv = result;
    else
      EXPECT_TRUE(bitwise_equal(first_dqkv, result)) << "dqkv is not reproducible";
  }
}

TEST_P(AttentionOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_attention, GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, AttentionOp,
    ::testing::Values(AttentionCase{1, 1, 2, 2, 2}, AttentionCase{1, 6, 1, 1, 5},
                      AttentionCase{2, 5, 3, 3, 2}, AttentionCase{3, 7, 2, 2, 5},
                      AttentionCase{2, 17, 3, 3, 8},
                      AttentionCase{2, 70, 3, 3, 32},    // head dim 32, partial last tile
                      AttentionCase{2, 64, 2, 2, 64},    // head dim 64, two whole tiles
                      AttentionCase{1, 33, 3, 3, 64},    // head dim 64, one row past a tile
                      AttentionCase{1, 256, 1, 1, 64},   // head dim 64, eight tiles
                      AttentionCase{1, 100, 2, 2, 128},  // head dim 128
                      AttentionCase{2, 40, 1, 1, 120},   // head dim 120 (padded to 128)
                      // Grouped query heads: each key/value head serves 4, 2, 4 or 3 of them.
                      AttentionCase{2, 37, 8, 2, 64}, AttentionCase{1, 1, 8, 2, 64},
                      AttentionCase{2, 37, 6, 3, 32}, AttentionCase{1, 1, 6, 3, 32},
                      AttentionCase{1, 70, 4, 1, 128},  // one key/value head for all
                      AttentionCase{1, 1, 4, 1, 128},
                      AttentionCase{2, 45, 6, 2, 40}));  // head dim 40 (padded to 64)

// Shapes the kernels cannot take are refused before anything runs, with the numbers in the
// message.
TEST(AttentionShapeCheck, RejectsBadShapes) {
  const cuda::AttentionShape bad_shapes[] = {
      {1, 8, 6, 4, 32},      // 4 key/value heads do not divide 6 query heads
      {1, 8, 4, 0, 32},      // no key/value heads
      {1, 8, 4, 4, 256},     // head dimension above kMaxAttentionHeadDim
      {65536, 8, 1, 1, 32},  // B * heads above one grid dimension
      {1, 0, 4, 4, 32},      // empty sequence
  };
  for (const cuda::AttentionShape& shape : bad_shapes) {
    EXPECT_THROW(cuda::attention_forward<float>(nullptr, nullptr, nullptr, shape, kStream), Error);
    EXPECT_THROW(cuda::attention_backward<float>(nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                                                 nullptr, kStream),
                 Error);
  }
}

// cuDNN's fused attention (the bf16 mode's default where cuDNN is built in) against the same CPU
// op. cuDNN takes head dimensions that are multiples of 8; it overwrites dqkv. Reproducibility is
// the next test's.
class CudnnAttentionOp : public ::testing::TestWithParam<AttentionCase> {};

void check_cudnn_attention(const AttentionCase& c, AlgorithmChoice choice) {
  std::string why;
  if (!cuda::CudnnAttention::available(&why)) GTEST_SKIP() << why;
  using T = __nv_bfloat16;
  const cuda::AttentionShape shape = c.shape();
  const auto [B, T_, heads, kv_heads, hd] = shape;
  Rng rng(B * 1000 + T_ * 10 + heads * hd + kv_heads + 7);
  const size_t BT = static_cast<size_t>(B) * T_;
  const size_t qkv_size = BT * shape.qkv_width(), out_size = BT * shape.out_width();
  const std::vector<float> qkv = rounded<T>(random_vector(rng, qkv_size));
  std::vector<float> out_expected(out_size), att(static_cast<size_t>(B) * heads * T_ * T_);
  grouped_query_attention_forward(out_expected.data(), att.data(), qkv.data(), B, T_, heads,
                                  kv_heads, hd);

  cuda::GrowableWorkspace workspace;
  cuda::CudnnAttention attention(kStream, workspace, choice);
  DeviceTensor<T> d_qkv(qkv), out(out_size);
  DeviceArray<float> lse(static_cast<size_t>(B) * heads * T_);
  out.array.poison();
  lse.poison();
  attention.forward(out.get(), lse.get(), d_qkv.get(), shape);
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "cuDNN attention out");
  LAYUP_EXPECT_RELATIVE(lse.download(), attention_lse_reference(qkv, shape), {}, tolerance<T>(),
                        "cuDNN attention lse");

  const std::vector<float> dout = rounded<T>(random_vector(rng, out_size));
  std::vector<float> dqkv_expected(qkv_size, 0.0f);
  grouped_query_attention_backward(dqkv_expected.data(), dout.data(), qkv.data(), att.data(), B, T_,
                                   heads, kv_heads, hd);
  DeviceTensor<T> d_dout(dout), dqkv(qkv_size);
  dqkv.array.poison();  // dq, dk and dv must cover all of it, kv heads included
  attention.backward(dqkv.get(), d_dout.get(), d_qkv.get(), out.get(), lse.get(), shape);
  LAYUP_EXPECT_RELATIVE(dqkv.floats(), dqkv_expected, {}, tolerance<T>(), "cuDNN attention dqkv");
}

TEST_P(CudnnAttentionOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  check_cudnn_attention(GetParam(), AlgorithmChoice::kHeuristic);
}

// --algorithms timed: every plan runs on the operands first; the outputs are still the winner's.
TEST_P(CudnnAttentionOp, TimedPlansMatchCpu) {
  LAYUP_REQUIRE_GPU();
  check_cudnn_attention(GetParam(), AlgorithmChoice::kTimed);
}

// --algorithms heuristic promises the same bits in every run: cuDNN's default backward sums dq
// with atomics in whatever order its blocks finish, so the backward must be its deterministic
// algorithm. The shape is the 3.88B checkpoint run's (many blocks per row of dq, where the order
// varies); five backward passes over the same operands give the same bytes.
TEST(CudnnAttentionDeterminism, HeuristicBackwardGivesTheSameBitsEveryTime) {
  LAYUP_REQUIRE_GPU();
  std::string why;
  if (!cuda::CudnnAttention::available(&why)) GTEST_SKIP() << why;
  using T = __nv_bfloat16;
  const cuda::AttentionShape shape{2, 1024, 28, 28, 128};
  const size_t BT = static_cast<size_t>(shape.B) * shape.T;
  const size_t qkv_size = BT * shape.qkv_width(), out_size = BT * shape.out_width();
  Rng rng(2024);
  cuda::GrowableWorkspace workspace;
  cuda::CudnnAttention attention(kStream, workspace, AlgorithmChoice::kHeuristic);
  DeviceTensor<T> qkv(random_vector(rng, qkv_size)), out(out_size),
      dout(random_vector(rng, out_size)), dqkv(qkv_size);
  DeviceArray<float> lse(BT * shape.heads);
  attention.forward(out.get(), lse.get(), qkv.get(), shape);
  std::vector<__nv_bfloat16> first;
  for (int pass = 0; pass < 5; ++pass) {
    dqkv.array.poison();
    attention.backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get(), shape);
    const std::vector<__nv_bfloat16> bits = dqkv.array.download();
    if (pass == 0) {
      first = bits;
      continue;
    }
    ASSERT_EQ(std::memcmp(bits.data(), first.data(), bits.size() * sizeof(bits[0])), 0)
        << "backward pass " << pass << " differs from the first";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, CudnnAttentionOp,
    ::testing::Values(AttentionCase{1, 2, 2, 2, 32},      // T = 2 (cuDNN rejects T = 1)
                      AttentionCase{2, 17, 2, 2, 64},     // head dim 64, odd T
                      AttentionCase{2, 70, 3, 3, 32},     // head dim 32
                      AttentionCase{3, 33, 3, 3, 64},     // B = 3, one row past 32
                      AttentionCase{1, 100, 2, 2, 128},   // head dim 128
                      AttentionCase{1, 1024, 1, 1, 64},   // GPT-2's context
                      AttentionCase{2, 256, 12, 12, 64},  // GPT-2's heads
                      // Grouped query heads.
                      AttentionCase{2, 37, 8, 2, 64}, AttentionCase{1, 2, 8, 2, 64},
                      AttentionCase{2, 37, 6, 3, 32}, AttentionCase{1, 70, 4, 1, 128},
                      AttentionCase{1, 256, 32, 8, 64}));  // Llama 3's 8B head layout

// ---- Classifier -------------------------------------------------------------------------------

struct ClassifierCase {
  int N, V, Vp;
};

void PrintTo(const ClassifierCase& c, std::ostream* os) {
  *os << "N" << c.N << "_V" << c.V << "_Vp" << c.Vp;
}

class ClassifierOp : public ::testing::TestWithParam<ClassifierCase> {};

template <class T>
void check_classifier(const ClassifierCase& shape) {
  const auto [N, V, Vp] = shape;
  Rng rng(N * 100000 + V);
  std::vector<float> logits = random_vector(rng, static_cast<size_t>(N) * Vp, 3.0f);
  // Padding holds garbage that must not leak into the loss or the gradient.
  for (int n = 0; n < N; ++n)
    for (int v = V; v < Vp; ++v)
      logits[static_cast<size_t>(n) * Vp + v] =
          (v % 2) ? 1e30f : std::numeric_limits<float>::quiet_NaN();
  logits = rounded<T>(logits);
  std::vector<int32_t> targets = random_tokens(rng, N, V);
  targets[0] = V - 1;                    // the last real column
  if (N >= 3) targets[1] = kNotLearned;  // loss 0, a row of zeros

  std::vector<float> losses_expected(N), lse_expected(N);
  classifier_forward(losses_expected.data(), lse_expected.data(), logits.data(), targets.data(), N,
                     V, Vp);
  DeviceTensor<T> d_logits(logits);
  DeviceArray<int32_t> d_targets(targets);
  DeviceArray<float> losses(N), lse(N);
  losses.poison();
  lse.poison();
  cuda::classifier_forward(losses.get(), lse.get(), d_logits.get(), d_targets.get(), N, V, Vp,
                           kStream);
  LAYUP_EXPECT_RELATIVE(losses.download(), losses_expected, {}, tolerance<T>(), "losses");
  LAYUP_EXPECT_RELATIVE(lse.download(), lse_expected, {}, tolerance<T>(), "lse");

  const float dloss = 0.37f / N;
  std::vector<float> dlogits_expected(static_cast<size_t>(N) * Vp);
  classifier_backward(dlogits_expected.data(), logits.data(), lse_expected.data(), targets.data(),
                      N, V, Vp, dloss);
  auto check_gradient = [&](const std::vector<float>& dlogits, const char* what) {
    LAYUP_EXPECT_RELATIVE(dlogits, dlogits_expected, {}, tolerance<T>(), what);
    for (int n = 0; n < N; ++n)
      for (int v = V; v < Vp; ++v)
        ASSERT_EQ(dlogits[static_cast<size_t>(n) * Vp + v], 0.0f)
            << what << " padded " << n << "," << v;
  };
  DeviceTensor<T> dlogits(static_cast<size_t>(N) * Vp);
  dlogits.array.poison();
  cuda::classifier_backward(dlogits.get(), d_logits.get(), lse.get(), d_targets.get(), N, V, Vp,
                            dloss, kStream);
  check_gradient(dlogits.floats(), "dlogits");
  // In place, as the backend runs it.
  cuda::classifier_backward(d_logits.get(), d_logits.get(), lse.get(), d_targets.get(), N, V, Vp,
                            dloss, kStream);
  check_gradient(d_logits.floats(), "dlogits in place");
}

TEST_P(ClassifierOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_classifier, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sizes, ClassifierOp,
                         ::testing::Values(ClassifierCase{1, 1, 8}, ClassifierCase{3, 5, 8},
                                           ClassifierCase{3, 7, 9}, ClassifierCase{7, 100, 128},
                                           ClassifierCase{5, 1000, 1024},
                                           ClassifierCase{2, 3001, 3008},
                                           ClassifierCase{4, 50257, 50304}));

}  // namespace
}  // namespace layup
