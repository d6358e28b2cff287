// Attention against a key/value cache on the CPU. Each (new position, query head) pair is one
// task: its scores over the cached positions, their softmax (the maximum subtracted, the sum in
// double, as attention.cpp's rows), and the weighted sum of the values. Generation runs one new
// position at a time, so the pairs are few and short; plain loops beat GEMM calls here.
#include "backend/cpu/ops/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "backend/cpu/ops/fast_exp.h"

namespace layup {

void attention_decode_forward(float* out, float* k_cache, float* v_cache, const float* qkv, int T,
                              int first, int Hq, int Hkv, int D) {
  const int qkv_width = (Hq + 2 * Hkv) * D, kv_width = Hkv * D;
  for (int t = 0; t < T; ++t) {
    const float* row = qkv + static_cast<size_t>(t) * qkv_width;
    std::copy_n(row + Hq * D, kv_width, k_cache + static_cast<size_t>(first + t) * kv_width);
    std::copy_n(row + (Hq + Hkv) * D, kv_width,
                v_cache + static_cast<size_t>(first + t) * kv_width);
  }
  const int group = Hq / Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
#pragma omp parallel
  {
    std::vector<float> probabilities(first + T);
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < Hq; ++h) {
        const int positions = first + t + 1;
        const size_t kv_offset = static_cast<size_t>(h / group) * D;
        const float* q = qkv + static_cast<size_t>(t) * qkv_width + static_cast<size_t>(h) * D;
        float max_score = -INFINITY;
        for (int u = 0; u < positions; ++u) {
          const float* k = k_cache + static_cast<size_t>(u) * kv_width + kv_offset;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int d = 0; d < D; ++d) dot += q[d] * k[d];
          probabilities[u] = scale * dot;
          max_score = std::max(max_score, probabilities[u]);
        }
        double sum = 0.0;
        for (int u = 0; u < positions; ++u) {
          probabilities[u] = exp_nonpositive(probabilities[u] - max_score);
          sum += probabilities[u];
        }
        const float inv_sum = static_cast<float>(1.0 / sum);
        float* o = out + static_cast<size_t>(t) * Hq * D + static_cast<size_t>(h) * D;
        std::fill_n(o, D, 0.0f);
        for (int u = 0; u < positions; ++u) {
          const float p = probabilities[u] * inv_sum;
          const float* v = v_cache + static_cast<size_t>(u) * kv_width + kv_offset;
#pragma omp simd
          for (int d = 0; d < D; ++d) o[d] += p * v[d];
        }
      }
    }
  }
}

}  // namespace layup
