// optimizer_shards: the shards cover the layout once, in rank order, cut only at a span's
// sum-of-squares chunk starts, and are as even as whole chunks allow.
#include "schedule/optimizer_shards.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/model_config.h"
#include "optim/grad_norm.h"

namespace layup {
namespace {

// Whether `at` is where a chunk of a span starts (or the layout's end).
bool chunk_start(const ParameterLayout& layout, size_t at) {
  if (at == layout.total_count()) return true;
  for (const Span& span : layout.spans())
    if (at >= span.offset && at < span.offset + span.count)
      return (at - span.offset) % kSumOfSquaresChunk == 0;
  return false;
}

TEST(OptimizerShards, CoverTheLayoutOnceCutAtChunkStarts) {
  // A vocabulary of 4096 x 64: the embeddings span four chunks, the blocks one each.
  const ParameterLayout layout(gpt2_config(3, 2, 64, 16, 4096));
  for (const int ranks : {1, 2, 3, 5}) {
    const OptimizerShards shards = optimizer_shards(layout, ranks);
    ASSERT_EQ(shards.bounds.size(), static_cast<size_t>(ranks) + 1);
    EXPECT_EQ(shards.bounds.front(), 0u);
    EXPECT_EQ(shards.bounds.back(), layout.total_count());
    EXPECT_TRUE(std::is_sorted(shards.bounds.begin(), shards.bounds.end()));
    size_t chunks = 0;
    for (const Span& span : layout.spans()) chunks += sum_of_squares_chunks(span.count);
    EXPECT_EQ(shards.span_chunks.back(), chunks);
    for (int r = 0; r <= ranks; ++r) {
      EXPECT_TRUE(chunk_start(layout, shards.bounds[r])) << ranks << " ranks, bound " << r;
      // A rank's chunks are those whose first element lies in its elements.
      EXPECT_LE(shards.chunk_bounds[r], chunks);
    }
    // As even as whole chunks allow: no shard longer than an even share plus a chunk.
    for (int r = 0; r < ranks; ++r)
      EXPECT_LE(shards.count(r), layout.total_count() / ranks + 1 + kSumOfSquaresChunk);
  }
}

TEST(OptimizerShards, ChunkBoundsMatchTheElementBounds) {
  const ParameterLayout layout(gpt2_config(3, 2, 64, 16, 4096));
  const OptimizerShards shards = optimizer_shards(layout, 3);
  for (int r = 0; r < 3; ++r) {
    // The first chunk of rank r starts at its first element.
    size_t first_element = layout.total_count();
    size_t index = 0;
    for (size_t i = 0; i < layout.spans().size(); ++i) {
      const Span& span = layout.spans()[i];
      for (size_t c = 0; c < sum_of_squares_chunks(span.count); ++c, ++index)
        if (index == shards.chunk_bounds[r]) first_element = span.offset + c * kSumOfSquaresChunk;
    }
    EXPECT_EQ(first_element, shards.bounds[r]) << "rank " << r;
  }
}

}  // namespace
}  // namespace layup
