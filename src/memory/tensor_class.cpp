// Names and parsing of tensor classes, memory kinds and sides.
#include "memory/tensor_class.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "core/error.h"

namespace layup {

namespace {

std::string lowercase(std::string_view text) {
  std::string result(text);
  std::transform(result.begin(), result.end(), result.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // "master_weights" and "master-weights" are the same name.
  std::replace(result.begin(), result.end(), '_', '-');
  return result;
}

}  // namespace

const char* tensor_class_name(TensorClass tensor_class) {
  switch (tensor_class) {
    case TensorClass::kWeights:
      return "weights";
    case TensorClass::kMasterWeights:
      return "master";
    case TensorClass::kWeightGrads:
      return "grads";
    case TensorClass::kOptimizerMoments:
      return "moments";
    case TensorClass::kActivations:
      return "activations";
    case TensorClass::kScratch:
      return "scratch";
  }
  return "?";
}

const char* tensor_class_label(TensorClass tensor_class) {
  switch (tensor_class) {
    case TensorClass::kWeights:
      return "weights";
    case TensorClass::kMasterWeights:
      return "master weights";
    case TensorClass::kWeightGrads:
      return "weight grads";
    case TensorClass::kOptimizerMoments:
      return "optimizer moments";
    case TensorClass::kActivations:
      return "activations";
    case TensorClass::kScratch:
      return "scratch";
  }
  return "?";
}

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kDevice:
      return "device";
    case MemoryKind::kPinnedMapped:
      return "pinned";
    case MemoryKind::kManaged:
      return "managed";
    case MemoryKind::kPageable:
      return "pageable";
    case MemoryKind::kHost:
      return "host";
  }
  return "?";
}

const char* memory_side_name(MemorySide side) {
  return side == MemorySide::kDevice ? "device side" : "host side";
}

TensorClass parse_tensor_class(std::string_view text) {
  const std::string name = lowercase(text);
  for (TensorClass tensor_class : kAllTensorClasses)
    if (name == tensor_class_name(tensor_class)) return tensor_class;
  if (name == "weight" || name == "compute-weights") return TensorClass::kWeights;
  if (name == "master-weights" || name == "master-weight") return TensorClass::kMasterWeights;
  if (name == "grad" || name == "gradients" || name == "weight-grads" || name == "weight-gradients")
    return TensorClass::kWeightGrads;
  if (name == "moment" || name == "optimizer-moments" || name == "adam" || name == "optimizer")
    return TensorClass::kOptimizerMoments;
  if (name == "activation" || name == "acts") return TensorClass::kActivations;
  fail("'", text,
       "' is not a tensor class; use weights, master, grads, moments, activations or scratch");
}

MemoryKind parse_memory_kind(std::string_view text) {
  const std::string name = lowercase(text);
  for (MemoryKind kind : kAllMemoryKinds)
    if (name == memory_kind_name(kind)) return kind;
  if (name == "pinned-mapped" || name == "mapped" || name == "zero-copy")
    return MemoryKind::kPinnedMapped;
  fail("'", text, "' is not a memory kind; use device, pinned, managed, pageable or host");
}

}  // namespace layup
