// The shape limits: each breach blamed on the flag that takes the sizes past a limit, with the
// largest value of that flag within them; published models at their usual shapes are within.
#include "model/shape_limits.h"

#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "core/error.h"

namespace layup {
namespace {

// The breach, which the test expects there to be.
ShapeLimitBreach breach_of(const ModelConfig& config, int batch, int seq_len) {
  const std::optional<ShapeLimitBreach> breach = shape_limit_breach(config, batch, seq_len);
  EXPECT_TRUE(breach.has_value());
  return breach.value_or(ShapeLimitBreach{});
}

TEST(ShapeLimits, PublishedModelsAtTheirShapesAreWithin) {
  EXPECT_FALSE(shape_limit_breach(named_config("gpt2-xl"), 64, 1024));
  EXPECT_FALSE(shape_limit_breach(named_config("llama-3-8b"), 4, 8192));
  EXPECT_FALSE(shape_limit_breach(named_config("small"), 32, 1024));
  EXPECT_NO_THROW(check_shape_limits(named_config("mistral-7b"), 1, 4096));
}

TEST(ShapeLimits, AWideModelBlamesDimNotTheBatch) {
  // `bench --layers 2 --heads 2 --dim 2000000000` at bench's default batch 32 x 1024.
  const ModelConfig wide = gpt2_config(2, 2, 2000000000, 1024);
  const ShapeLimitBreach breach = breach_of(wide, 32, 1024);
  EXPECT_EQ(breach.flag, "--dim");
  EXPECT_EQ(breach.value, 2000000000);
  const std::string message = breach.message();
  EXPECT_NE(message.find("--dim 2000000000 is too large"), std::string::npos) << message;
  EXPECT_EQ(message.find("--batch"), std::string::npos) << message;
  EXPECT_EQ(message.find("--seq-len"), std::string::npos) << message;
  // The advice is the edge: the largest width within, with the flags after --dim at 1.
  ModelConfig edge = gpt2_config(1, 1, static_cast<int>(breach.largest), 1);
  EXPECT_FALSE(shape_limit_breach(edge, 1, 1));
  edge.n_embd += 1;
  EXPECT_TRUE(shape_limit_breach(edge, 1, 1));
  EXPECT_THROW(check_shape_limits(wide, 32, 1024), Error);
}

TEST(ShapeLimits, EachFlagIsBlamedForItsOwnSize) {
  const ModelConfig tiny = gpt2_config(2, 2, 32, 1024);
  // More blocks than the layout and the schedules keep records for.
  ShapeLimitBreach breach = breach_of(gpt2_config(2000000000, 2, 32, 1024), 4, 64);
  EXPECT_EQ(breach.flag, "--layers");
  EXPECT_EQ(breach.largest, kMaxLayers);
  // A context whose position embeddings alone pass 2^50 parameters.
  breach = breach_of(gpt2_config(2, 8, 1 << 20, 2000000000), 1, 64);
  EXPECT_EQ(breach.flag, "--context");
  EXPECT_NE(breach.limit.find("parameters"), std::string::npos) << breach.limit;
  // A sequence whose attention probabilities (L x NH x T x T) pass 2^50 elements.
  ModelConfig long_context = tiny;
  long_context.n_positions = 2000000000;
  breach = breach_of(long_context, 1, 2000000000);
  EXPECT_EQ(breach.flag, "--seq-len");
  EXPECT_FALSE(shape_limit_breach(long_context, 1, static_cast<int>(breach.largest)));
  EXPECT_TRUE(shape_limit_breach(long_context, 1, static_cast<int>(breach.largest) + 1));
  // More tokens in a micro-batch than the backends' 32-bit indices reach.
  breach = breach_of(tiny, 2000000000, 1024);
  EXPECT_EQ(breach.flag, "--batch");
  EXPECT_EQ(breach.largest, INT_MAX / 1024);
  EXPECT_NE(breach.message().find("use --batch 2097151 or less"), std::string::npos)
      << breach.message();
}

TEST(ShapeLimits, HeadsAreBlamedWhereTheyWidenTheAttention) {
  // A Llama-family config with its own head width: the heads alone make q, k and v too tall.
  ModelConfig config = llama_config(2, 4, 4, 256, 1024, 128, 1000);
  config.head_size = 64;
  config.n_head = 1 << 26;
  const ShapeLimitBreach breach = breach_of(config, 1, 16);
  EXPECT_EQ(breach.flag, "--heads");
  EXPECT_NE(breach.limit.find("32-bit"), std::string::npos) << breach.limit;
  config.n_head = static_cast<int>(breach.largest);
  EXPECT_FALSE(shape_limit_breach(config, 1, 1));
}

TEST(ShapeLimits, AModelPastThemAtEverySizeOneIsBlamedOnTheModel) {
  // No flag of the shape helps: the config's own MLP width (2 x intermediate_size) is too tall.
  ModelConfig config = llama_config(2, 4, 4, 256, 1024, 128, 1000);
  config.intermediate_size = 1 << 30;
  const ShapeLimitBreach breach = breach_of(config, 1, 1);
  EXPECT_TRUE(breach.flag.empty());
  EXPECT_NE(breach.message().find("choose a smaller --model"), std::string::npos);
}

TEST(ShapeLimits, SizesBelowOneAreLeftToTheirOwnChecks) {
  EXPECT_FALSE(shape_limit_breach(gpt2_config(2, 2, 32, 64), 0, 16));
  EXPECT_FALSE(shape_limit_breach(gpt2_config(2, 2, 32, 64), 4, -1));
}

}  // namespace
}  // namespace layup
