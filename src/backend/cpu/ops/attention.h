// Causal self-attention on a fused q,k,v projection: grouped-query (Llama, Qwen2, Mistral) and
// its multi-head special case (GPT-2).
#pragma once

namespace layup {

// qkv [B,T,(Hq+2Hkv)D]: Hq query heads in channels [0, Hq D), then Hkv key heads, then Hkv value
// heads, D channels each. Hkv divides Hq; query head h reads K/V head h / (Hq/Hkv), so each K/V
// head serves Hq/Hkv consecutive query heads (transformers' repeat_kv order).
// out [B,T,Hq D]: out[b,t,h] = sum_{t2<=t} att[b,h,t,t2] v[b,t2,h/(Hq/Hkv)], with
// att[b,h,t,:] = softmax_{t2<=t}(q[b,t,h] . k[b,t2,h/(Hq/Hkv)] / sqrt(D)).
// Writes out and saves att [B,Hq,T,T] (the probabilities; zero above the diagonal) for backward.
void grouped_query_attention_forward(float* out, float* att, const float* qkv, int B, int T, int Hq,
                                     int Hkv, int D);

// Accumulates dqkv [B,T,(Hq+2Hkv)D] from dout [B,T,Hq D], using qkv and the saved att. The
// gradient of a K/V head adds up the contributions of all the query heads it serves.
void grouped_query_attention_backward(float* dqkv, const float* dout, const float* qkv,
                                      const float* att, int B, int T, int Hq, int Hkv, int D);

// GPT-2's multi-head attention: Hq = Hkv = NH, D = C/NH, so qkv is [B,T,3C] with q in channels
// [0,C), k in [C,2C), v in [2C,3C), and out is [B,T,C]. The same computation, bit for bit.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH);

}  // namespace layup
