// Causal self-attention through cuDNN's fused flash attention (its SDPA graph, built with the
// cuDNN frontend), for the bf16 mode: tensor cores, and no T x T matrix in device memory.
//
// Same contract as attention.cuh (AttentionShape, grouped key/value heads included): q, k and v
// are read in place from the fused qkv through strides, the output has its heads merged, and the
// saved statistic is the natural-log log-sum-exp of each row of scaled scores, lse [B,heads,T] --
// the same quantity the layup kernel saves, so the two share their activation memory. Unlike the
// layup kernel, backward OVERWRITES dqkv (cuDNN writes dq, dk and dv, which together cover all of
// it).
//
// Graphs are built once per shape (AttentionShape) and cached: building takes milliseconds to
// seconds, executing microseconds. The workspace cuDNN asks for is the caller's GrowableWorkspace,
// grown when a larger shape needs more.
//
// Built only where CMake found cuDNN and the cuDNN frontend headers (LAYUP_HAVE_CUDNN); elsewhere
// available() says why not and the backend uses the layup kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "backend/algorithm_choice.h"
#include "backend/cuda/growable_workspace.h"
#include "backend/cuda/ops/attention.cuh"

namespace layup::cuda {

class CudnnAttention {
 public:
  // Whether this build and this machine can run cuDNN attention; when not, *why says why.
  static bool available(std::string* why);

  // `workspace` (which outlives this) grows to the size cuDNN asks for (with `choice` kTimed: the
  // largest any of the plans it times asks for). With kHeuristic the backward is cuDNN's
  // deterministic algorithm (the same bits in every run) where this cuDNN has one.
  CudnnAttention(cudaStream_t stream, GrowableWorkspace& workspace,
                 AlgorithmChoice choice = AlgorithmChoice::kHeuristic);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Throws layup::Error with cuDNN's message when cuDNN cannot run this shape (checked when the
  // shape's graph is first built).
  void forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv,
               const AttentionShape& shape);
  void backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                const __nv_bfloat16* out, const float* lse, const AttentionShape& shape);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace layup::cuda
