// The Llama family's CUDA ops (RMSNorm, rotary embeddings, SwiGLU) against the CPU ops, in the
// harness of cuda_ops_test.cu: random inputs of several shapes (odd sizes, one row), fp32 and
// bf16 (inputs rounded to bf16 first, so the op's own error is measured), outputs poisoned before
// an op writes them, relative L2 limits of 1e-5 (fp32) and 1e-2 (bf16).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <vector>

#include "backend/cpu/ops/gradient_check.h"
#include "backend/cpu/ops/rmsnorm.h"
#include "backend/cpu/ops/rope.h"
#include "backend/cpu/ops/swiglu.h"
#include "backend/cuda/cuda_test_support.h"
#include "backend/cuda/ops/rmsnorm.cuh"
#include "backend/cuda/ops/rope.cuh"
#include "backend/cuda/ops/swiglu.cuh"
#include "core/rng.h"

namespace layup {
namespace {

using namespace cuda_test;
using op_test::random_vector;

constexpr cudaStream_t kStream = nullptr;

struct RowsCase {
  int N, C;
};

void PrintTo(const RowsCase& c, std::ostream* os) {
  *os << "N" << c.N << "_C" << c.C;
}

class RmsNormOp : public ::testing::TestWithParam<RowsCase> {};

template <class T>
void check_rmsnorm(const RowsCase& shape) {
  const auto [N, C] = shape;
  constexpr float kEps = 1e-5f;
  Rng rng(N * 100 + C);
  const std::vector<float> x = rounded<T>(random_vector(rng, N * C, 2.0f, 0.5f));
  const std::vector<float> w = rounded<T>(random_vector(rng, C, 0.3f, 1.0f));
  std::vector<float> out_expected(N * C), rstd_expected(N);
  rmsnorm_forward(out_expected.data(), rstd_expected.data(), x.data(), w.data(), N, C, kEps);
  DeviceTensor<T> d_x(x), d_w(w), out(N * C);
  DeviceArray<float> rstd(N);
  out.array.poison();
  rstd.poison();
  cuda::rmsnorm_forward(out.get(), rstd.get(), d_x.get(), d_w.get(), N, C, kEps, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "rmsnorm out");
  LAYUP_EXPECT_RELATIVE(rstd.download(), rstd_expected, {}, tolerance<T>(), "rmsnorm rstd");

  // Backward from the CPU's saved rstd, accumulating into dinp; dweight accumulated, then
  // overwritten.
  const std::vector<float> dout = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> dx_initial = rounded<T>(random_vector(rng, N * C));
  const std::vector<float> dw_initial = random_vector(rng, C);
  std::vector<float> dx_expected = dx_initial, dw_expected = dw_initial;
  rmsnorm_backward(dx_expected.data(), dw_expected.data(), dout.data(), x.data(), w.data(),
                   rstd_expected.data(), N, C);
  DeviceTensor<T> d_dout(dout), dx(dx_initial);
  DeviceArray<float> d_rstd(rstd_expected), dw(dw_initial);
  DeviceArray<float> scratch(cuda::rmsnorm_backward_scratch_floats(N, C));
  cuda::rmsnorm_backward(dx.get(), dw.get(), d_dout.get(), d_x.get(), d_w.get(), d_rstd.get(), N, C,
                         cuda::WeightGradient::kAccumulate, scratch.get(), kStream);
  LAYUP_EXPECT_RELATIVE(dx.floats(), dx_expected, accumulator_baseline<T>(dx_initial),
                        tolerance<T>(), "rmsnorm dinp");
  LAYUP_EXPECT_RELATIVE(dw.download(), dw_expected, dw_initial, tolerance<T>(), "rmsnorm dweight");

  std::vector<float> dx_unused(N * C, 0.0f), dw_alone(C, 0.0f);
  rmsnorm_backward(dx_unused.data(), dw_alone.data(), dout.data(), x.data(), w.data(),
                   rstd_expected.data(), N, C);
  DeviceTensor<T> dx2(dx_initial);
  DeviceArray<float> dw2(C);
  dw2.poison();
  cuda::rmsnorm_backward(dx2.get(), dw2.get(), d_dout.get(), d_x.get(), d_w.get(), d_rstd.get(), N,
                         C, cuda::WeightGradient::kOverwrite, scratch.get(), kStream);
  LAYUP_EXPECT_RELATIVE(dw2.download(), dw_alone, {}, tolerance<T>(), "rmsnorm dweight overwrite");
}

TEST_P(RmsNormOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_rmsnorm, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sizes, RmsNormOp,
                         ::testing::Values(RowsCase{1, 3}, RowsCase{5, 13}, RowsCase{33, 64},
                                           RowsCase{300, 2048}));

class SwigluOp : public ::testing::TestWithParam<RowsCase> {};

template <class T>
void check_swiglu(const RowsCase& shape) {
  const auto [N, I] = shape;
  Rng rng(N * 10 + I);
  const std::vector<float> gate_up = rounded<T>(random_vector(rng, 2 * N * I, 3.0f));
  std::vector<float> out_expected(N * I);
  swiglu_forward(out_expected.data(), gate_up.data(), N, I);
  DeviceTensor<T> d_gate_up(gate_up), out(N * I);
  out.array.poison();
  cuda::swiglu_forward(out.get(), d_gate_up.get(), N, I, kStream);
  LAYUP_EXPECT_RELATIVE(out.floats(), out_expected, {}, tolerance<T>(), "swiglu out");

  const std::vector<float> dout = rounded<T>(random_vector(rng, N * I));
  const std::vector<float> d_initial = rounded<T>(random_vector(rng, 2 * N * I));
  std::vector<float> d_expected = d_initial;
  swiglu_backward(d_expected.data(), dout.data(), gate_up.data(), N, I);
  DeviceTensor<T> d_dout(dout), d(d_initial);
  cuda::swiglu_backward(d.get(), d_dout.get(), d_gate_up.get(), N, I, kStream);
  LAYUP_EXPECT_RELATIVE(d.floats(), d_expected, accumulator_baseline<T>(d_initial), tolerance<T>(),
                        "swiglu dgate_up");
}

TEST_P(SwigluOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_swiglu, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sizes, SwigluOp,
                         ::testing::Values(RowsCase{1, 1}, RowsCase{7, 13}, RowsCase{64, 96},
                                           RowsCase{129, 1376}));

struct RopeCase {
  int B, T, Hq, Hkv, D;
};

void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << "B" << c.B << "_T" << c.T << "_Hq" << c.Hq << "_Hkv" << c.Hkv << "_D" << c.D;
}

class RopeOp : public ::testing::TestWithParam<RopeCase> {};

// On the fused qkv, as the model runs it: q and k turned in place, v left exactly as it was.
template <class T>
void check_rope(const RopeCase& shape) {
  const auto [B, T_, Hq, Hkv, D] = shape;
  const int row = (Hq + 2 * Hkv) * D;
  Rng rng(B * 1000 + T_ * 10 + D);
  RopeScaling llama3{true, 8.0f, 1.0f, 4.0f, 16};
  std::vector<float> inv_freq(D / 2), cos(static_cast<size_t>(T_) * D / 2), sin(cos.size());
  rope_inverse_frequencies(inv_freq.data(), D, 500000.0f, llama3);
  rope_cos_sin(cos.data(), sin.data(), inv_freq.data(), T_, D);
  DeviceArray<float> d_cos(cos), d_sin(sin);

  const std::vector<float> qkv = rounded<T>(random_vector(rng, static_cast<size_t>(B) * T_ * row));
  for (int backward = 0; backward < 2; ++backward) {
    std::vector<float> expected = qkv;
    if (backward)
      rope_backward(expected.data(), expected.data(), cos.data(), sin.data(), B, T_, Hq + Hkv, D,
                    row);
    else
      rope_forward(expected.data(), expected.data(), cos.data(), sin.data(), B, T_, Hq + Hkv, D,
                   row);
    DeviceTensor<T> rows(qkv);
    if (backward)
      cuda::rope_backward(rows.get(), d_cos.get(), d_sin.get(), B, T_, Hq + Hkv, D, row, kStream);
    else
      cuda::rope_forward(rows.get(), d_cos.get(), d_sin.get(), B, T_, Hq + Hkv, D, row, kStream);
    const std::vector<float> result = rows.floats();
    LAYUP_EXPECT_RELATIVE(result, expected, {}, tolerance<T>(),
                          backward ? "rope backward" : "rope forward");
    for (size_t r = 0; r < static_cast<size_t>(B) * T_; ++r)
      for (int c = (Hq + Hkv) * D; c < row; ++c)
        ASSERT_EQ(std::memcmp(&result[r * row + c], &qkv[r * row + c], sizeof(float)), 0)
            << "v changed at row " << r << ", channel " << c;
  }
}

TEST_P(RopeOp, MatchesCpu) {
  LAYUP_REQUIRE_GPU();
  LAYUP_FOR_EACH_DTYPE(check_rope, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Sizes, RopeOp,
                         ::testing::Values(RopeCase{1, 1, 1, 1, 2}, RopeCase{2, 7, 4, 2, 16},
                                           RopeCase{3, 33, 6, 2, 64}, RopeCase{1, 128, 8, 8, 128}));

}  // namespace
}  // namespace layup
