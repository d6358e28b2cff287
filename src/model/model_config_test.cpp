// The checks every model config passes: an explicit --layers/--heads/--dim shape refused naming
// the flags, and the first field two shapes differ in, as resume and load messages name it.
#include "model/model_config.h"

#include <gtest/gtest.h>

#include <string>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;

TEST(ModelConfig, ExplicitShapesAreRefusedNamingTheFlags) {
  EXPECT_NO_THROW(validate_config(gpt2_config(2, 4, 64, 32)));
  EXPECT_TRUE(contains(error_message([] { validate_config(gpt2_config(2, 3, 64, 32)); }),
                       "the model width 64 (--dim) is not divisible by its 3 attention heads "
                       "(--heads)"));
  EXPECT_TRUE(contains(error_message([] { validate_config(gpt2_config(2, 0, 64, 32)); }),
                       "at least 1 attention head (--heads; got 0)"));
  EXPECT_TRUE(contains(error_message([] { validate_config(gpt2_config(0, 4, 64, 32)); }),
                       "at least 1 layer (--layers; got 0)"));
  EXPECT_TRUE(contains(error_message([] { validate_config(gpt2_config(2, 4, -64, 32)); }),
                       "the model width (--dim) must be positive (got -64)"));
}

TEST(ModelConfig, KeyValueHeadsMustDivideTheHeads) {
  EXPECT_NO_THROW(validate_config(llama_config(2, 4, 2, 64, 96, 32, 100)));
  EXPECT_TRUE(
      contains(error_message([] { validate_config(llama_config(2, 4, 3, 64, 96, 32, 100)); }),
               "num_key_value_heads 3 must divide num_attention_heads 4"));
  // ModelConfig's own 0 means one per head; a negative count is no shape at all.
  EXPECT_NO_THROW(validate_config(llama_config(2, 4, 0, 64, 96, 32, 100)));
  EXPECT_TRUE(
      contains(error_message([] { validate_config(llama_config(2, 4, -2, 64, 96, 32, 100)); }),
               "negative head count"));
}

TEST(ModelConfig, FirstShapeDifferenceNamesTheField) {
  const ModelConfig base = llama_config(2, 4, 2, 64, 96, 32, 100);
  EXPECT_FALSE(first_shape_difference(base, base));
  ModelConfig other = base;
  other.rope_theta = 5e5f;  // the same parameters' shapes
  EXPECT_FALSE(first_shape_difference(base, other));
  other.n_kv_head = 4;
  const auto kv = first_shape_difference(base, other);
  ASSERT_TRUE(kv);
  EXPECT_EQ(kv->field, "num_key_value_heads");
  EXPECT_EQ(kv->first, "2");
  EXPECT_EQ(kv->second, "4");
  other = base;
  other.tie_word_embeddings = true;
  ASSERT_TRUE(first_shape_difference(base, other));
  EXPECT_EQ(first_shape_difference(base, other)->second, "true");
  const auto family = first_shape_difference(base, gpt2_config(2, 4, 64, 32, 100));
  ASSERT_TRUE(family);
  EXPECT_EQ(family->field, "model_type");
  const auto layers = first_shape_difference(gpt2_config(2, 4, 64, 32), gpt2_config(3, 4, 64, 32));
  ASSERT_TRUE(layers);
  EXPECT_EQ(layers->field, "n_layer");
}

}  // namespace
}  // namespace layup
