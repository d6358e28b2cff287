// How the CPU ops divide work among OpenMP threads: contiguous, balanced ranges in thread order.
//
// Ops that reduce (sum over positions into a weight gradient) give each thread whole output
// elements, never a share of one sum, so no two threads add into the same float and the result
// depends only on the thread count, never on timing.
#pragma once

#include <omp.h>

#include <algorithm>

namespace layup {

struct IndexRange {
  int begin, end;
  int size() const { return end - begin; }
};

// The share of [0, count) that `thread` of `threads` owns. Boundaries fall on multiples of
// `granularity` (except the last), so SIMD-friendly tiles are not cut in the middle.
inline IndexRange thread_share(int count, int thread, int threads, int granularity = 1) {
  const int units = (count + granularity - 1) / granularity;
  const int per_thread = units / threads, extra = units % threads;
  const int first_unit = thread * per_thread + std::min(thread, extra);
  const int unit_count = per_thread + (thread < extra ? 1 : 0);
  return IndexRange{std::min(count, first_unit * granularity),
                    std::min(count, (first_unit + unit_count) * granularity)};
}

// The calling thread's share inside an OpenMP parallel region.
inline IndexRange my_share(int count, int granularity = 1) {
  return thread_share(count, omp_get_thread_num(), omp_get_num_threads(), granularity);
}

}  // namespace layup
