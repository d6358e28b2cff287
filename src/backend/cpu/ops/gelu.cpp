// GELU (tanh approximation), forward and backward.
//
// With u = k (x + 0.044715 x^3), k = sqrt(2/pi), and y = 0.5 x (1 + tanh u):
//
//   dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3 * 0.044715 x^2)
//
// The elementwise math runs as Eigen array expressions (vectorized tanh), one contiguous slice per
// OpenMP thread, in chunks that are computed into Eigen-allocated (aligned) scratch and copied
// out. Eigen evaluates the unaligned leading elements of a destination with its scalar tanh, which
// rounds differently from the vectorized one; going through aligned scratch makes each element's
// value independent of where the caller's buffers sit and of the thread count.
#include "backend/cpu/ops/gelu.h"

#include <Eigen/Core>
#include <algorithm>

#include "backend/cpu/ops/thread_split.h"

namespace layup {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int kChunk = 4096;
// Thread slices and chunks start on multiples of 16 elements, so the only elements Eigen leaves
// to its scalar tail are the last N % 8 of the whole array, for any thread count.
constexpr int kChunkGranularity = 16;

using ConstArrayView = Eigen::Map<const Eigen::ArrayXf>;

}  // namespace

void gelu_forward(float* out, const float* inp, int N) {
#pragma omp parallel
  {
    const IndexRange range = my_share(N, kChunkGranularity);
    Eigen::ArrayXf y(kChunk);
    for (int begin = range.begin; begin < range.end; begin += kChunk) {
      const int n = std::min(kChunk, range.end - begin);
      const ConstArrayView x(inp + begin, n);
      y.head(n) = 0.5f * x * (1.0f + (kSqrt2OverPi * (x + kCubic * x.cube())).tanh());
      std::copy_n(y.data(), n, out + begin);
    }
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
#pragma omp parallel
  {
    const IndexRange range = my_share(N, kChunkGranularity);
    Eigen::ArrayXf tanh_u(kChunk), dx(kChunk);
    for (int begin = range.begin; begin < range.end; begin += kChunk) {
      const int n = std::min(kChunk, range.end - begin);
      const ConstArrayView x(inp + begin, n);
      const ConstArrayView dy(dout + begin, n);
      tanh_u.head(n) = (kSqrt2OverPi * (x + kCubic * x.cube())).tanh();
      dx.head(n) = dy * (0.5f * (1.0f + tanh_u.head(n)) +
                         0.5f * x * (1.0f - tanh_u.head(n).square()) * kSqrt2OverPi *
                             (1.0f + 3.0f * kCubic * x.square()));
      for (int i = 0; i < n; ++i) dinp[begin + i] += dx[i];
    }
  }
}

}  // namespace layup
