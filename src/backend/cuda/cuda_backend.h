// The CUDA backend: GPT-2's and the Llama family's forward and block-wise backward
// (backend/model_backend.h; the model graph of backend/model_graph.h) as CUDA kernels and cuBLASLt
// matmuls on one stream, in fp32 or in bf16 with fp32 accumulation.
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
#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/model_backend.h"
#include "memory/memory_accountant.h"
#include "model/model_config.h"

namespace layup {

// Throws layup::Error when there is no usable GPU, when the model's head dimension exceeds what
// the attention kernels take (128), or when the activations do not fit in GPU memory. The
// backend records its memory (its three regions by class and kind, the pinned staging, the cuBLASLt
// and cuDNN workspaces) in `accountant` when one is given: every buffer of cuda_backend_buffers
// (cuda_backend_buffers.h, which also says what `recompute` and `kinds` choose), allocated as
// listed, and cuDNN's workspace when cuDNN sizes it.
std::unique_ptr<ModelBackend> make_cuda_backend(
    const ModelConfig& config, int max_batch, int max_seq_len, ComputeDtype dtype,
    int recompute = 0, std::shared_ptr<MemoryAccountant> accountant = nullptr,
    const CudaArenaKinds& kinds = {}, AlgorithmChoice algorithms = AlgorithmChoice::kHeuristic,
    AttentionChoice attention = AttentionChoice::kAuto);

}  // namespace layup
