// The CUDA backend: GPT-2's forward and block-wise backward (backend/model_backend.h) as CUDA
// kernels and cuBLASLt matmuls on one stream, in fp32 or in bf16 with fp32 accumulation.
//
// Plain C++ header: callers need no CUDA headers.
//
// Memory. Parameters and gradients are never owned here: ParameterPointers and GradientPointers
// are DEVICE pointers to fp32 spans (the master weights and the fp32 gradient buffers, wherever
// the schedule keeps them). Every activation the backward needs is allocated once, at
// construction, for max_batch x max_seq_len.
//
// Precision. In kBFloat16 mode each forward first refreshes a bf16 compute copy of the weights
// from the fp32 master (one cast kernel per span), then runs with bf16 activations and fp32
// accumulation inside every kernel and matmul; weight gradients still land (+=) in the fp32
// gradient buffers. kFloat32 is true fp32 everywhere (no TF32), and matches the CPU backend.
//
// Differences from the CPU backend a caller can see:
//  - backward_head turns the logits into their gradient in place (the [B*T, Vp] logits are the
//    largest activation), so logits() is only valid between a forward and the next
//    backward_head, and a backward pass needs its own forward (running one twice throws).
//  - forward synchronizes once, to read the loss; the backward calls only enqueue work. The
//    gradients are complete for anything that synchronizes with CUDA's legacy default stream
//    (the CUDA device's operations, cudaMemcpy), because the backend's stream is a blocking one.
#pragma once

#include <memory>

#include "backend/algorithm_choice.h"
#include "backend/model_backend.h"
#include "memory/memory_accountant.h"
#include "model/gpt2_config.h"

namespace layup {

enum class ComputeDtype { kFloat32, kBFloat16 };

const char* compute_dtype_name(ComputeDtype dtype);  // "fp32", "bf16"

// How much the backward recomputes instead of keeping from the forward (--recompute):
//   0  keep every block's activations;
//   1  keep the MLP's pre-GELU activations only and recompute GELU's output in the backward
//      (one [B*T, 4C] buffer serves all blocks instead of one per block);
//   2  also recompute both layer norms' outputs from their inputs and saved statistics.
// Level 1 saves (L-1) B T 4C activation elements (one shared buffer instead of L), level 2
// another (2L-1) B T C (one instead of 2L), for one element-wise pass (and, at 2, two layer
// norms) per block in the backward.
constexpr int kMaxRecompute = 2;

// Throws layup::Error when there is no usable GPU, when the model's head dimension exceeds what
// the attention kernels take (128), or when the activations do not fit in GPU memory. The
// backend records its memory (its three regions by class and kind, the pinned staging, the cuBLASLt
// and cuDNN workspaces) in `accountant` when one is given.
// Where the backend's activations and the backward's scratch live (--place activations=...,
// scratch=...; memory/memory_plan.h checks the kinds first). The bf16 compute copy of the weights
// is always in device memory.
struct CudaArenaKinds {
  MemoryKind activations = MemoryKind::kDevice;
  MemoryKind scratch = MemoryKind::kDevice;
};

std::unique_ptr<ModelBackend> make_cuda_backend(
    const Gpt2Config& config, int max_batch, int max_seq_len, ComputeDtype dtype, int recompute = 0,
    std::shared_ptr<MemoryAccountant> accountant = nullptr, const CudaArenaKinds& kinds = {},
    AlgorithmChoice algorithms = AlgorithmChoice::kHeuristic);

}  // namespace layup
