// Deterministic parallel sum of squares, and the clip factor.
#include "optim/grad_norm.h"

#include <algorithm>
#include <vector>

namespace layup {

double sum_of_squares(const float* x, size_t count) {
  constexpr size_t kChunk = 1 << 16;
  const size_t chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t end = std::min(count, (c + 1) * kChunk);
    double sum = 0.0;
    for (size_t i = c * kChunk; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
    partial[c] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

float clip_factor(double total_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double factor = max_norm / (total_norm + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

}  // namespace layup
