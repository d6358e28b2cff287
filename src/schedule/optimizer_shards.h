// Which part of the optimizer state each rank owns when several train (ZeRO-1, docs/parallel.md):
// contiguous ranges of the flat layout, cut only where a sum-of-squares chunk of a span starts,
// so that each rank takes whole chunks' sums and the norm keeps the grouping every mode uses.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/parameter_layout.h"

namespace layup {

struct OptimizerShards {
  // Rank r owns elements [bounds[r], bounds[r + 1]) and the sum-of-squares chunks
  // [chunk_bounds[r], chunk_bounds[r + 1]) of the layout's chunk list (each span's chunks from its
  // first element, the spans in layout order).
  std::vector<size_t> bounds, chunk_bounds;
  // Per span, the index of its first chunk in that list; one more entry: the number of chunks.
  std::vector<size_t> span_chunks;

  size_t begin(int rank) const { return bounds[rank]; }
  size_t end(int rank) const { return bounds[rank + 1]; }
  size_t count(int rank) const { return end(rank) - begin(rank); }

  // A span's part in rank `rank`'s shard: `count` elements from element `first` of the span.
  struct Part {
    size_t first = 0, count = 0;
  };
  Part part(const Span& span, int rank) const {
    const size_t from = std::max(span.offset, begin(rank));
    const size_t to = std::min(span.offset + span.count, end(rank));
    if (from >= to) return {};
    return {from - span.offset, to - from};
  }
  // Every rank's bounds within layout elements [first, last), from `first` (a collective's).
  std::vector<size_t> bounds_within(size_t first, size_t last) const {
    std::vector<size_t> within;
    for (const size_t bound : bounds) within.push_back(std::clamp(bound, first, last) - first);
    return within;
  }
  // Every rank's bounds within span `index`'s chunks, from its first chunk.
  std::vector<size_t> chunk_bounds_of(size_t index) const {
    std::vector<size_t> within;
    for (const size_t bound : chunk_bounds)
      within.push_back(std::clamp(bound, span_chunks[index], span_chunks[index + 1]) -
                       span_chunks[index]);
    return within;
  }
};

// Checkpoint export with ZeRO-1: rank 0 asks each owner for its part of a span's moments with
// these four words, and ends the exchange with kEndExports (Schedule::serve_exports).
constexpr uint64_t kEndExports = 0, kSendMoments = 1;

// The shards of `layout` over `ranks` ranks, as even in elements as whole chunks allow.
OptimizerShards optimizer_shards(const ParameterLayout& layout, int ranks);

}  // namespace layup
