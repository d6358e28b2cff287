// Deterministic parallel sum of squares, and the clip factor.
//
// A chunk's sum is a chain of dependent double additions, so one chain runs at the latency of an
// add (several cycles per element), far below memory speed. Summing several chunks side by side
// keeps several independent chains in flight; each chain still adds its own chunk's squares in
// index order, and the square of a float is exact in double (24 + 24 bits of mantissa < 53), so
// whether the compiler fuses the multiply into the add does not change a bit either.
#include "optim/grad_norm.h"

#include <algorithm>
#include <vector>

namespace layup {

namespace {

// Sums K whole chunks starting at x side by side, into sums[0 .. K).
template <int K>
void sum_whole_chunks(const float* x, double* sums) {
  double acc[K] = {};
  for (size_t i = 0; i < kSumOfSquaresChunk; ++i) {
    for (int k = 0; k < K; ++k) {
      const double value = x[k * kSumOfSquaresChunk + i];
      acc[k] += value * value;
    }
  }
  for (int k = 0; k < K; ++k) sums[k] = acc[k];
}

}  // namespace

void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk, size_t end_chunk,
                           double* chunk_sums) {
  // Whole chunks, eight, four, two or one at a time; then the short last chunk, if any.
  const size_t whole_end = std::min(end_chunk, count / kSumOfSquaresChunk);
  size_t c = first_chunk;
  for (; c + 8 <= whole_end; c += 8)
    sum_whole_chunks<8>(x + c * kSumOfSquaresChunk, chunk_sums + c);
  if (c + 4 <= whole_end) {
    sum_whole_chunks<4>(x + c * kSumOfSquaresChunk, chunk_sums + c);
    c += 4;
  }
  if (c + 2 <= whole_end) {
    sum_whole_chunks<2>(x + c * kSumOfSquaresChunk, chunk_sums + c);
    c += 2;
  }
  if (c < whole_end) {
    sum_whole_chunks<1>(x + c * kSumOfSquaresChunk, chunk_sums + c);
    ++c;
  }
  for (; c < end_chunk; ++c) {
    const size_t end = std::min(count, (c + 1) * kSumOfSquaresChunk);
    double sum = 0.0;
    for (size_t i = c * kSumOfSquaresChunk; i < end; ++i) {
      const double value = x[i];
      sum += value * value;
    }
    chunk_sums[c] = sum;
  }
}

double add_chunk_sums(const double* chunk_sums, size_t chunks) {
  double total = 0.0;
  for (size_t c = 0; c < chunks; ++c) total += chunk_sums[c];
  return total;
}

double sum_of_squares(const float* x, size_t count) {
  // Eight chunks per OpenMP iteration: eight chains in flight per thread.
  constexpr size_t kChunksPerTask = 8;
  const size_t chunks = sum_of_squares_chunks(count);
  std::vector<double> sums(chunks, 0.0);
  const size_t tasks = (chunks + kChunksPerTask - 1) / kChunksPerTask;
#pragma omp parallel for schedule(static)
  for (size_t t = 0; t < tasks; ++t) {
    chunk_sums_of_squares(x, count, t * kChunksPerTask, std::min(chunks, (t + 1) * kChunksPerTask),
                          sums.data());
  }
  return add_chunk_sums(sums.data(), chunks);
}

float clip_factor(double total_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double factor = max_norm / (total_norm + 1e-6);
  return factor < 1.0 ? static_cast<float>(factor) : 1.0f;
}

}  // namespace layup
