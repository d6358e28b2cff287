// Causal multi-head self-attention on GPT-2's fused q,k,v projection.
#pragma once

namespace layup {

// qkv [B,T,3C]: q in channels [0,C), k in [C,2C), v in [2C,3C); head h uses channels
// [h*hd, (h+1)*hd) of each, hd = C/NH.
// out [B,T,C]: out[b,t,head h] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,head h], with
// att[b,h,t,:] = softmax_{t2<=t}(q[b,t,h] . k[b,t2,h] / sqrt(hd)).
// Writes out and saves att [B,NH,T,T] (the probabilities; zero above the diagonal) for backward.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// Accumulates dqkv [B,T,3C] from dout [B,T,C], using qkv and the saved att.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

}  // namespace layup
