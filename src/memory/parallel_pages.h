// Zeroing and copying large host buffers on every core: the first write to fresh memory faults its
// pages in, which one thread does at a few GB/s, so a 100 GiB plan's set-up took minutes.
#pragma once

#include <cstddef>

namespace layup {

// memset(data, 0, bytes), in chunks spread over the OpenMP threads.
void zero_in_parallel(void* data, size_t bytes);

// std::copy_n(src, count, dst) for non-overlapping buffers, in chunks spread over the threads.
void copy_in_parallel(float* dst, const float* src, size_t count);

}  // namespace layup
