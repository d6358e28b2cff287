// zero_in_parallel and copy_in_parallel; see parallel_pages.h.
#include "memory/parallel_pages.h"

#include <algorithm>
#include <cstring>

namespace layup {

namespace {

// Big enough that a thread's chunk amortises the fork; small enough to balance over the threads.
constexpr size_t kChunkBytes = size_t{64} << 20;

}  // namespace

void zero_in_parallel(void* data, size_t bytes) {
  char* at = static_cast<char*>(data);
  const long chunks = static_cast<long>((bytes + kChunkBytes - 1) / kChunkBytes);
  if (chunks <= 1) {
    std::memset(at, 0, bytes);
    return;
  }
#pragma omp parallel for schedule(static)
  for (long chunk = 0; chunk < chunks; ++chunk) {
    const size_t begin = static_cast<size_t>(chunk) * kChunkBytes;
    std::memset(at + begin, 0, std::min(kChunkBytes, bytes - begin));
  }
}

void copy_in_parallel(float* dst, const float* src, size_t count) {
  constexpr size_t kChunk = kChunkBytes / sizeof(float);
  const long chunks = static_cast<long>((count + kChunk - 1) / kChunk);
  if (chunks <= 1) {
    std::copy_n(src, count, dst);
    return;
  }
#pragma omp parallel for schedule(static)
  for (long chunk = 0; chunk < chunks; ++chunk) {
    const size_t begin = static_cast<size_t>(chunk) * kChunk;
    std::copy_n(src + begin, std::min(kChunk, count - begin), dst + begin);
  }
}

}  // namespace layup
