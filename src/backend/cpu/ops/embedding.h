// Token (+ position) embedding: the first op of the forward and the last of the backward. The
// Llama family has no position table (its positions are rotary): wpe and dwpe are then null.
#pragma once

#include <cstdint>

namespace layup {

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]
// out [B,T,C]; tokens [B,T], each in [0, rows of wte); wte [V,C]; wpe [>=T, C].
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C);

// dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t, :] += sum_b dout[b,t,:]
// Accumulates, adding each row's total once; the same for any thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C);

}  // namespace layup
