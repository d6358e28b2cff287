// Rotary position embeddings as Hugging Face Llama applies them (rotate_half: channel i of a head
// pairs with channel i + D/2, not with its neighbour), and the frequencies they rotate by.
#pragma once

#include "model/model_config.h"  // RopeScaling

namespace layup {

// inv_freq [D/2]: theta^(-2i/D) for i in [0, D/2), then rescaled by Llama 3's rule where
// `scaling.llama3` (model_config.h). Throws layup::Error for an odd or non-positive head_dim or
// invalid scaling values.
void rope_inverse_frequencies(float* inv_freq, int head_dim, float theta,
                              const RopeScaling& scaling);

// cos, sin [T, D/2]: of the angle t * inv_freq[i] (rounded to float first, as transformers does),
// for positions t in [0, T). Built once; a table of T rows serves every sequence up to T long.
void rope_cos_sin(float* cos, float* sin, const float* inv_freq, int T, int head_dim);

// Where the heads are: each of the B*T rows of inp and out holds row_stride floats, and the
// `heads` heads to rotate, D floats each, are the first heads * D of them. Position t of row (b,t)
// is t. This fits attention's fused qkv [B,T,(Hq+2Hkv)D] (attention.h): its q heads and k heads
// are adjacent, so one call with heads = Hq + Hkv and row_stride = (Hq+2Hkv)D rotates q and k in
// place, without a copy, and leaves v alone. Separate q [B,T,Hq,D] and k [B,T,Hkv,D] tensors are
// heads = Hq (or Hkv) with row_stride = heads * D.
//
// For each rotated head, with x1 = x[:D/2], x2 = x[D/2:], c = cos[t], s = sin[t]:
//   out[:D/2] = x1 c - x2 s,   out[D/2:] = x2 c + x1 s.
// out may be inp (in place). Only the rotated heads are written; other channels of out are left
// as they are. cos and sin [>=T, D/2] come from rope_cos_sin.
void rope_forward(float* out, const float* inp, const float* cos, const float* sin, int B, int T,
                  int heads, int head_dim, int row_stride);

// The transpose of the forward: rotates dout by the negative angle into dinp, in the same layout.
// Unlike most backwards here it overwrites dinp rather than adding to it, so that it can run in
// place (dinp = dout) on the qkv gradient attention_backward accumulated.
void rope_backward(float* dinp, const float* dout, const float* cos, const float* sin, int B, int T,
                   int heads, int head_dim, int row_stride);

}  // namespace layup
