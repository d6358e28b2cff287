// Softmax cross-entropy, forward and backward.
//
// For one row with logits z over the real vocabulary and target y:
//
//   lse  = log sum_v exp(z_v)          loss = lse - z_y
//   dloss/dz_v = softmax(z)_v - [v == y] = exp(z_v - lse) - [v == y]
//
// A row (50k logits for GPT-2) does not fit in L1, so the forward walks it once, in blocks that
// do: each block's max m_b and sum s_b = sum exp(z - m_b) are computed while the block is in
// cache, and the blocks are combined in double, lse = M + log sum_b s_b exp(m_b - M) with
// M = max_b m_b. Subtracting a max keeps every exp in range. The forward saves lse per row, so the
// backward is a single pass as well: exp(z - lse) is the softmax itself. The padded columns never
// enter a max or a sum, and their gradient is written as exact zeros so the padded rows of the
// tied embedding receive none. A row whose target is below 0 is not learned (a prompt token of an
// instruction example): it is skipped, with loss 0 and a gradient of exact zeros.
#include "backend/cpu/ops/classifier.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/ops/fast_exp.h"

namespace layup {
namespace {

constexpr int kBlock = 1024;  // floats: 4 KB, well inside L1

}  // namespace

void classifier_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                        int N, int V, int Vp) {
  const int blocks = (V + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> block_max(blocks), block_sum(blocks);
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      if (targets[n] < 0) {
        lse[n] = 0.0f;
        losses[n] = 0.0f;
        continue;
      }
      const float* z = logits + static_cast<size_t>(n) * Vp;
      for (int k = 0; k < blocks; ++k) {
        const float* block = z + k * kBlock;
        const int size = std::min(kBlock, V - k * kBlock);
        // Eigen's max reduction: exact in any order, and faster than the compiler's.
        const float max = Eigen::Map<const Eigen::ArrayXf>(block, size).maxCoeff();
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < size; ++i) sum += exp_nonpositive(block[i] - max);
        block_max[k] = max;
        block_sum[k] = sum;
      }
      const float max = *std::max_element(block_max.begin(), block_max.end());
      double sum = 0.0;
      for (int k = 0; k < blocks; ++k)
        sum += block_sum[k] * std::exp(static_cast<double>(block_max[k]) - max);
      const double row_lse = max + std::log(sum);
      lse[n] = static_cast<float>(row_lse);
      losses[n] = static_cast<float>(row_lse - z[targets[n]]);
    }
  }
}

void classifier_backward(float* dlogits, const float* logits, const float* lse,
                         const int32_t* targets, int N, int V, int Vp, float dloss) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* z = logits + static_cast<size_t>(n) * Vp;
    float* dz = dlogits + static_cast<size_t>(n) * Vp;
    if (targets[n] < 0) {
      for (int v = 0; v < Vp; ++v) dz[v] = 0.0f;
      continue;
    }
    const float row_lse = lse[n];
    // Elementwise, so dz may be z itself.
#pragma omp simd
    for (int v = 0; v < V; ++v) dz[v] = exp_nonpositive(z[v] - row_lse) * dloss;
    dz[targets[n]] -= dloss;
    for (int v = V; v < Vp; ++v) dz[v] = 0.0f;
  }
}

}  // namespace layup
