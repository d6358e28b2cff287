// Which part of the optimizer state each rank owns when several train (ZeRO-1, docs/parallel.md):
// contiguous ranges of the flat layout, cut only where a sum-of-squares chunk of a span starts,
// so that each rank takes whole chunks' sums and the norm keeps the grouping every mode uses.
#pragma once

#include <cstddef>
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
};

// The shards of `layout` over `ranks` ranks, as even in elements as whole chunks allow.
OptimizerShards optimizer_shards(const ParameterLayout& layout, int ranks);

}  // namespace layup
