// Global gradient norm and the clip factor derived from it.
//
// The sum of squares has one fixed grouping, whoever computes it: the vector is cut into chunks
// of kSumOfSquaresChunk elements (from its first element), each chunk is summed in index order
// in double, and the chunk sums are added in chunk order. Any thread may compute any chunk, so the
// work can be split over OpenMP threads (sum_of_squares) or over a schedule's CPU workers
// (chunk_sums_of_squares on whole chunks, then add_chunk_sums) with the same bits: the resume and
// mode-equivalence guarantees depend on that.
#pragma once

#include <cstddef>

namespace layup {

constexpr size_t kSumOfSquaresChunk = size_t{1} << 16;

// How many chunks a vector of `count` elements has.
inline size_t sum_of_squares_chunks(size_t count) {
  return (count + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk;
}

// Sum of squares of x in double, grouped as above, so bitwise reproducible for any thread count.
double sum_of_squares(const float* x, size_t count);

// The sums of chunks [first_chunk, end_chunk) of x (a vector of `count` elements) into
// chunk_sums[first_chunk .. end_chunk): the pieces sum_of_squares adds up.
void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk, size_t end_chunk,
                           double* chunk_sums);

// The chunk sums added in chunk order: sum_of_squares' result from its pieces.
double add_chunk_sums(const double* chunk_sums, size_t chunks);

// The factor torch.nn.utils.clip_grad_norm_ multiplies gradients by: max_norm / (norm + 1e-6)
// when that is below 1, else 1. max_norm <= 0 means no clipping.
float clip_factor(double total_norm, float max_norm);

}  // namespace layup
