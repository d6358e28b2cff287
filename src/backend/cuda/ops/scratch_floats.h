// Floats of scratch the backward ops need, as plain C++: the CUDA backend sizes its scratch with
// these, and so does cuda_backend_buffers, which the memory plan calls in builds without CUDA.
#pragma once

#include <algorithm>
#include <cstddef>

namespace layup::cuda {

// The deterministic column reduction (common.cuh) cuts the N rows into this many chunks (a
// function of N alone, never of the GPU), at most kMaxRowChunks, and keeps one partial per chunk
// and column.
constexpr int kMaxRowChunks = 128;

inline int column_reduce_chunks(int N) {
  return std::clamp((N + 63) / 64, 1, kMaxRowChunks);
}

// Scratch floats for `outputs` column sums over an [N, C] matrix.
inline size_t column_reduce_scratch_floats(int N, int C, int outputs) {
  return static_cast<size_t>(outputs) * column_reduce_chunks(N) * C;
}

// matmul_backward (matmul.cuh): the bias gradient's column sums over dout [N,OC].
inline size_t matmul_backward_scratch_floats(int N, int OC) {
  return column_reduce_scratch_floats(N, OC, 1);
}

// layernorm_backward (layernorm.cuh): the weight's and the bias's column sums over N rows of C.
inline size_t layernorm_backward_scratch_floats(int N, int C) {
  return column_reduce_scratch_floats(N, C, 2);
}

// attention_backward (attention.cuh): one float per row of scores.
inline size_t attention_backward_scratch_floats(int B, int T_, int NH) {
  return static_cast<size_t>(B) * T_ * NH;
}

}  // namespace layup::cuda
