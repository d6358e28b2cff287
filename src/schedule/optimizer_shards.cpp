// optimizer_shards: the cut points of ZeRO-1's shards.
#include "schedule/optimizer_shards.h"

#include <algorithm>

#include "core/error.h"
#include "optim/grad_norm.h"

namespace layup {

OptimizerShards optimizer_shards(const ParameterLayout& layout, int ranks) {
  LAYUP_CHECK(ranks >= 1, "internal error: optimizer shards for ", ranks, " ranks");
  OptimizerShards shards;
  std::vector<size_t> chunk_starts;  // every chunk's first element, in layout order
  for (const Span& span : layout.spans()) {
    shards.span_chunks.push_back(chunk_starts.size());
    for (size_t c = 0; c < sum_of_squares_chunks(span.count); ++c)
      chunk_starts.push_back(span.offset + c * kSumOfSquaresChunk);
  }
  shards.span_chunks.push_back(chunk_starts.size());
  const size_t total = layout.total_count();
  shards.bounds = {0};
  shards.chunk_bounds = {0};
  for (int r = 1; r < ranks; ++r) {
    // The first chunk starting at or after an even share's end.
    const size_t target = total * r / ranks;
    const auto at = std::lower_bound(chunk_starts.begin(), chunk_starts.end(), target);
    shards.chunk_bounds.push_back(static_cast<size_t>(at - chunk_starts.begin()));
    shards.bounds.push_back(at == chunk_starts.end() ? total : *at);
  }
  shards.bounds.push_back(total);
  shards.chunk_bounds.push_back(chunk_starts.size());
  return shards;
}

}  // namespace layup
