// The CPU backend's memory, described once: two host regions (the activations the backward needs,
// the backward's scratch), each cut into the backend's buffers by carve_cpu_backend. The memory
// plan sums cpu_backend_buffers; the backend's constructor allocates that same list and carves it
// with the same function, so the plan cannot drift from what is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "memory/planned_allocation.h"
#include "model/model_config.h"

namespace layup {

// Every buffer CpuBackend allocates at construction for this shape: its activations and its
// scratch, host memory on the device side, recorded in the accountant while the backend lives.
// Throws layup::Error for a shape the backend refuses (B or T below 1, T beyond the context).
BufferList cpu_backend_buffers(const ModelConfig& config, int max_batch, int max_seq_len);

// What one transformer block saves in its forward for its backward. Rows are the B*T positions.
// Widths as in GPT-2 (Q = 3C, A = C, F = M = 4C) or the Llama family (Q = (NH + 2 KVH) D,
// A = NH D, F = 2I: gate and up, M = I); the norms' means are GPT-2's only (RMSNorm has none).
struct CpuBlockActivations {
  float *ln_1, *ln_1_mean, *ln_1_rstd;  // [BT,C], [BT], [BT]
  float* qkv;                           // [BT,Q] (rotary positions applied, in the Llama family)
  float* att;                           // [B,NH,T,T] softmax probabilities
  float* att_out;                       // [BT,A] heads merged, before c_proj / o_proj
  float* residual_mid;                  // [BT,C] x + attention branch
  float *ln_2, *ln_2_mean, *ln_2_rstd;  // [BT,C], [BT], [BT]
  float* fc;                            // [BT,F] before GELU / SwiGLU
  float* fc_gelu;                       // [BT,M] after GELU / SwiGLU
};

// Where each of the backend's buffers lies inside its two regions.
struct CpuBackendArena {
  // In the activations region.
  int32_t *inputs, *targets;  // [BT] the last forward's batch
  // residual[l] is block l's input; residual[L] is the input of ln_f. [BT,C] each.
  std::vector<float*> residual;
  std::vector<CpuBlockActivations> blocks;
  float *ln_f, *ln_f_mean, *ln_f_rstd;  // [BT,C], [BT], [BT]
  float* logits;                        // [BT,Vp]
  float* losses;                        // [BT]
  float* logsumexp;                     // [BT] of the real-vocabulary logits
  float* rope_cos = nullptr;            // [T, D/2]: the Llama family's rotary table
  float* rope_sin = nullptr;            // [T, D/2]

  // In the scratch region. branch_out holds a branch before its residual add; d_residual is
  // dL/d(residual stream) where backward has reached; the rest are gradients of one block's
  // intermediates.
  float* branch_out;      // [BT,C]
  float* d_residual;      // [BT,C]
  float* d_ln;            // [BT,C] gradient of a layer norm's output
  float* d_att_out;       // [BT,A]
  float* d_qkv;           // [BT,Q]
  float* d_fc_gelu;       // [BT,M]
  float* d_fc;            // [BT,F]
  float* d_logits_chunk;  // [logits_chunk_rows, Vp]
  int logits_chunk_rows;  // rows of dlogits the head's backward materializes at a time
};

// Each piece starts at a multiple of this many bytes inside its region: whole cache lines and
// aligned AVX-512 loads. The regions themselves are allocated at this alignment.
constexpr size_t kCpuArenaAlignBytes = 64;

// Bytes of each region, alignment padding included.
struct CpuRegionBytes {
  size_t activations = 0;
  size_t scratch = 0;
};

// Cuts every buffer out of the regions at `activations` and `scratch`, in order, and fills `arena`
// with where each lies; with null bases it only measures (the pointers are then null). Both
// passes give the same offsets and the returned sizes. Does not check the shape.
CpuRegionBytes carve_cpu_backend(const ModelConfig& config, int max_batch, int max_seq_len,
                                 char* activations, char* scratch, CpuBackendArena& arena);

}  // namespace layup
