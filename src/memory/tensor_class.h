// The two axes of a placement plan: what a buffer holds (its tensor class) and what kind of
// memory it lives in (its memory kind), with the names the CLI and the reports use.
//
// Classes follow docs/design.md: the weights the compute reads, the fp32 master weights AdamW
// updates, weight gradients, AdamW moments, activations saved for backward, and scratch
// (activation gradients, op workspaces, staging). Kinds: `device` (cudaMalloc), `pinned`
// (cudaHostAlloc, mapped: the GPU can read and write it over the interconnect), `managed`
// (cudaMallocManaged), `pageable` (plain host memory the GPU touches directly, only where the
// device reports pageable memory access), and `host` (plain host memory no GPU touches: the CPU
// backend's memory, and host-side state the CPU alone reads and writes).
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace layup {

enum class TensorClass {
  kWeights,           // the compute copy of the weights (what forward and backward read)
  kMasterWeights,     // fp32 weights that AdamW updates
  kWeightGrads,       // weight gradients, and their accumulators and staging copies
  kOptimizerMoments,  // AdamW's m and v
  kActivations,       // what the forward saves for the backward
  kScratch,           // activation gradients, workspaces, staging of inputs and losses
};
constexpr int kTensorClassCount = 6;

enum class MemoryKind { kDevice, kPinnedMapped, kManaged, kPageable, kHost };
constexpr int kMemoryKindCount = 5;

// Which side of a run a buffer belongs to: the memory the device computes on (through Device or
// a backend), or the host-side state of a schedule. On the CPU backend both are host memory;
// the sides still tell `gpu` mode's state from `layup`'s, and --device-budget / --host-budget
// count them separately.
enum class MemorySide { kDevice, kHost };
constexpr int kMemorySideCount = 2;

constexpr std::array<TensorClass, kTensorClassCount> kAllTensorClasses = {
    TensorClass::kWeights,          TensorClass::kMasterWeights, TensorClass::kWeightGrads,
    TensorClass::kOptimizerMoments, TensorClass::kActivations,   TensorClass::kScratch};
constexpr std::array<MemoryKind, kMemoryKindCount> kAllMemoryKinds = {
    MemoryKind::kDevice, MemoryKind::kPinnedMapped, MemoryKind::kManaged, MemoryKind::kPageable,
    MemoryKind::kHost};
constexpr std::array<MemorySide, kMemorySideCount> kAllMemorySides = {MemorySide::kDevice,
                                                                      MemorySide::kHost};

// The CLI names: weights, master, grads, moments, activations, scratch.
const char* tensor_class_name(TensorClass tensor_class);
// For reports: "weights", "master weights", "weight grads", "optimizer moments", ...
const char* tensor_class_label(TensorClass tensor_class);
// device, pinned, managed, pageable, host.
const char* memory_kind_name(MemoryKind kind);
// "device side", "host side".
const char* memory_side_name(MemorySide side);

// Parses a class as --place writes it: the CLI name or a spelled-out alias ("master-weights",
// "weight-grads", "gradients", "optimizer-moments", "adam", ...). Throws layup::Error listing
// the names for anything else.
TensorClass parse_tensor_class(std::string_view text);
// Parses a kind: device, pinned (or pinned-mapped, mapped), managed, pageable, host. Throws
// layup::Error listing the names for anything else.
MemoryKind parse_memory_kind(std::string_view text);

constexpr int index_of(TensorClass tensor_class) {
  return static_cast<int>(tensor_class);
}
constexpr int index_of(MemoryKind kind) {
  return static_cast<int>(kind);
}
constexpr int index_of(MemorySide side) {
  return static_cast<int>(side);
}

}  // namespace layup
