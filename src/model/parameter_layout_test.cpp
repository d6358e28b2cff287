// Pins the block-contiguous layout: spans tile the buffer, blocks share offsets, counts match
// GPT-2.
#include "model/parameter_layout.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace layup {
namespace {

TEST(ParameterLayout, SpansTileTheBufferInOrder) {
  const ParameterLayout layout(named_config("small"));
  size_t next = 0;
  for (const Span& span : layout.spans()) {
    EXPECT_EQ(span.offset, next);
    next += span.count;
  }
  EXPECT_EQ(next, layout.total_count());
  ASSERT_EQ(layout.spans().size(), 2u + layout.config().n_layer);
  EXPECT_EQ(layout.spans().front().kind, SpanKind::kEmbeddings);
  EXPECT_EQ(layout.spans().back().kind, SpanKind::kFinalNorm);
}

TEST(ParameterLayout, TensorsTileEachSpan) {
  const ParameterLayout layout(named_config("small"));
  for (const Span& span : layout.spans()) {
    size_t next = 0;
    for (const TensorSpec& tensor : layout.tensors_in(span)) {
      EXPECT_EQ(tensor.offset_in_span, next) << tensor.name;
      EXPECT_EQ(tensor.offset, span.offset + next) << tensor.name;
      next += tensor.count;
    }
    EXPECT_EQ(next, span.count);
  }
}

TEST(ParameterLayout, Gpt2SmallHas124MParameters) {
  const Gpt2Config config = named_config("gpt2");
  EXPECT_EQ(parameter_count(config), 124439808);
  const ParameterLayout layout(config);
  const size_t padding = static_cast<size_t>(config.padded_vocab_size - config.vocab_size) * 768;
  EXPECT_EQ(layout.total_count(), static_cast<size_t>(parameter_count(config)) + padding);
  EXPECT_EQ(config.padded_vocab_size, 50304);
}

TEST(ParameterLayout, WeightDecayOnlyOnMatricesExceptPositions) {
  const ParameterLayout layout(named_config("small"));
  for (const TensorSpec& tensor : layout.tensors()) {
    const bool matrix = tensor.shape.size() == 2 && tensor.name != "wpe.weight";
    EXPECT_EQ(tensor.weight_decay, matrix) << tensor.name;
  }
}

TEST(Gpt2Config, RejectsBadShapesAndNames) {
  Gpt2Config config = named_config("small");
  config.n_head = 3;  // 128 is not divisible by 3
  EXPECT_THROW(validate_config(config), Error);
  EXPECT_THROW(named_config("gpt5"), Error);
  try {
    named_config("gpt5");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("gpt2-medium"), std::string::npos);
  }
}

}  // namespace
}  // namespace layup
