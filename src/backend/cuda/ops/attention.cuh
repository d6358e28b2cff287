// Causal multi-head self-attention on GPT-2's fused q,k,v projection, on the GPU, flash-attention
// style: the T x T scores are never stored. Same math as the CPU op (backend/cpu/ops/attention.h),
// but what the forward saves for the backward is the log-sum-exp of each score row, not the
// probabilities. T is float or __nv_bfloat16; all arithmetic is fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/cuda/ops/scratch_floats.h"

namespace layup::cuda {

// The largest head dimension (C / NH) the kernels take. GPT-2 uses 64 at every size.
constexpr int kMaxAttentionHeadDim = 128;

// qkv [B,T,3C]: q in channels [0,C), k in [C,2C), v in [2C,3C); head h uses channels
// [h*hd, (h+1)*hd) of each, hd = C/NH.
// out [B,T,C]: out[b,t,head h] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,head h], with
// att[b,h,t,:] = softmax_{t2<=t}(q[b,t,h] . k[b,t2,h] / sqrt(hd)).
// Writes out and lse [B,NH,T] = log sum_{t2<=t} exp(score[b,h,t,t2]) for the backward.
template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH,
                       cudaStream_t stream);

// Floats of scratch attention_backward needs: attention_backward_scratch_floats
// (scratch_floats.h).

// Accumulates dqkv [B,T,3C] from dout [B,T,C], recomputing the scores from qkv and the saved lse;
// out is the forward's output. Deterministic: every element of dqkv is summed by one thread.
template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                        int T_, int C, int NH, float* scratch, cudaStream_t stream);

}  // namespace layup::cuda
