// Tensor class and memory kind names: every name parses back, aliases work, and anything else is
// refused with the list of names.
#include "memory/tensor_class.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace layup {
namespace {

TEST(TensorClass, NamesParseBack) {
  for (TensorClass c : kAllTensorClasses) EXPECT_EQ(parse_tensor_class(tensor_class_name(c)), c);
  for (MemoryKind kind : kAllMemoryKinds)
    EXPECT_EQ(parse_memory_kind(memory_kind_name(kind)), kind);
}

TEST(TensorClass, AliasesAndCaseAreAccepted) {
  EXPECT_EQ(parse_tensor_class("master_weights"), TensorClass::kMasterWeights);
  EXPECT_EQ(parse_tensor_class("Weight-Grads"), TensorClass::kWeightGrads);
  EXPECT_EQ(parse_tensor_class("adam"), TensorClass::kOptimizerMoments);
  EXPECT_EQ(parse_memory_kind("PINNED"), MemoryKind::kPinnedMapped);
  EXPECT_EQ(parse_memory_kind("mapped"), MemoryKind::kPinnedMapped);
}

TEST(TensorClass, UnknownNamesAreRefusedWithTheList) {
  try {
    parse_tensor_class("biases");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("weights, master, grads, moments"), std::string::npos)
        << error.what();
  }
  try {
    parse_memory_kind("vram");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("device, pinned, managed, pageable or host"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace layup
