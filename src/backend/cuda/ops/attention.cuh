// Causal self-attention on a fused q,k,v projection (GPT-2's multi-head and the Llama family's
// grouped-query), on the GPU, flash-attention style: the T x T scores are never stored. Same math
// as the CPU op (backend/cpu/ops/attention.h), but what the forward saves for the backward is the
// log-sum-exp of each score row, not the probabilities. T is float or __nv_bfloat16; all arithmetic
// is fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/ops/scratch_floats.h"

namespace layup::cuda {

// The largest head_dim the kernels take. GPT-2 uses 64 at every size.
constexpr int kMaxAttentionHeadDim = 128;

// The shape of one attention call: B sequences of T positions, `heads` query heads and
// `kv_heads` key/value heads of head_dim channels each. kv_heads divides heads; GPT-2 has as many
// as query heads, the Llama family fewer (grouped-query attention).
struct AttentionShape {
  int B = 0, T = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Elements per position of the fused projection qkv, and of the output.
  int qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
  int out_width() const { return heads * head_dim; }
};

// qkv [B,T,qkv_width]: the query heads in channels [0, heads*hd), then the key heads, then the
// value heads, hd = head_dim channels each (GPT-2's c_attn output is the case kv_heads = heads).
// Query head h reads key/value head h / (heads/kv_heads), transformers' repeat_kv order, as the CPU
// op (backend/cpu/ops/attention.h).
// out [B,T,out_width]: out[b,t,h] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,h'], with
// att[b,h,t,:] = softmax_{t2<=t}(q[b,t,h] . k[b,t2,h'] / sqrt(hd)), h' = h / (heads/kv_heads).
// Writes out and lse [B,heads,T] = log sum_{t2<=t} exp(score[b,h,t,t2]) for the backward.
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, const AttentionShape& shape,
                       cudaStream_t stream);

// Floats of scratch attention_backward needs: attention_backward_scratch_floats
// (scratch_floats.h), with the query heads.

// Accumulates dqkv [B,T,qkv_width] from dout [B,T,out_width], recomputing the scores from qkv and
// the saved lse; out is the forward's output. A key/value head's gradient sums the contributions of
// the query heads it serves. Deterministic: every element of dqkv is summed by one thread, in a
// fixed order.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse,
                        const AttentionShape& shape, float* scratch, cudaStream_t stream);

}  // namespace layup::cuda
