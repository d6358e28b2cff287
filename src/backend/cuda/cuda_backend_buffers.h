// What the CUDA backend and the CUDA device allocate, listed before they do: the functions their
// constructors allocate from and the memory plan sums (memory/planned_allocation.h). Plain C++,
// built in every build (also without CUDA), so the plan needs neither a GPU nor CUDA headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/planned_allocation.h"
#include "memory/tensor_class.h"
#include "model/model_config.h"

namespace layup {

enum class ComputeDtype { kFloat32, kBFloat16 };

const char* compute_dtype_name(ComputeDtype dtype);  // "fp32", "bf16"

// How much the backward recomputes instead of keeping from the forward (--recompute):
//   0  keep every block's activations;
//   1  keep the MLP's pre-GELU activations only and recompute GELU's output in the backward
//      (one [B*T, 4C] buffer serves all blocks instead of one per block);
//   2  also recompute both layer norms' outputs from their inputs and saved statistics;
//   3  keep only each block's input and re-run the block's forward (up to the MLP's GELU) right
//      before its backward (full activation checkpointing).
// Level 1 saves (L-1) B T 4C activation elements (one shared buffer instead of L), level 2
// another (2L-1) B T C (one instead of 2L), for one element-wise pass (and, at 2, two layer
// norms) per block in the backward. Level 3 keeps one block's activations for all blocks, about
// 16 B T C elements instead of 16 L B T C, for a second forward of every block but the last (a
// step's matmul work then grows from 6 to about 8 FLOPs per parameter and token).
constexpr int kMaxRecompute = 3;

// Where the backend's activations and the backward's scratch live (--place activations=...,
// scratch=...; the memory plan checks the kinds first). The bf16 compute copy of the weights is
// always in device memory, except the spans compute_copy_elsewhere marks (per span, layout order;
// empty: none): their copy is placed by the schedule (a streamed block's ring slot,
// ModelBackend::place_compute_copy), and the weights region leaves them out.
struct CudaArenaKinds {
  MemoryKind activations = MemoryKind::kDevice;
  MemoryKind scratch = MemoryKind::kDevice;
  std::vector<char> compute_copy_elsewhere{};
};

// cuBLASLt's workspace: one device allocation per backend (cuBLAS's recommendation for Hopper).
constexpr size_t kCublasLtWorkspaceBytes = size_t{32} << 20;
// The CUDA device's gradient norm sums squares in this many blocks, one double partial each.
constexpr int kCudaDeviceNormPartials = 1024;

// The CUDA backend's pinned host staging, one allocation: the token ids, targets and the
// embedding backward's grouping going up (five int32 arrays of B*T, one of them +1), then the B*T
// losses coming back.
struct PinnedStagingLayout {
  size_t ints;    // int32 at the start
  size_t losses;  // floats after them
  size_t bytes() const { return ints * sizeof(int32_t) + losses * sizeof(float); }
};
PinnedStagingLayout pinned_staging_layout(int max_batch, int max_seq_len);

// The CUDA backend's buffers by role; cuda_backend_buffers lists them.
struct CudaBackendBuffers {
  // Indexed by ArenaRegion (cuda_arena.h): the bf16 compute copy of the weights (0 bytes in fp32),
  // the activations, the scratch. Each region's bytes are what carve() measures.
  std::array<PlannedAllocation, 3> regions;
  PlannedAllocation cublaslt_workspace;
  PlannedAllocation pinned_staging;

  // The allocations, leaving out an empty weights region (fp32).
  BufferList list() const;
};

CudaBackendBuffers describe_cuda_backend_buffers(const ModelConfig& config, int max_batch,
                                                 int max_seq_len, ComputeDtype dtype, int recompute,
                                                 const CudaArenaKinds& kinds);

// Every buffer CudaBackend<T> allocates at construction for this shape, dtype and --recompute
// level. cuDNN's attention workspace is not among them: cuDNN sizes it when the first step builds
// its graphs (the backend records it then).
BufferList cuda_backend_buffers(const ModelConfig& config, int max_batch, int max_seq_len,
                                ComputeDtype dtype, int recompute, const CudaArenaKinds& kinds);

// The CUDA device's own buffers: the gradient norm's partial sums.
BufferList cuda_device_buffers();

// What the CUDA device's collectives (NCCL, several ranks) allocate: one round's receive buffer,
// whatever the model.
BufferList cuda_collectives_buffers();
// The floats of that round.
constexpr size_t kNcclRoundFloats = size_t{1} << 24;

}  // namespace layup
