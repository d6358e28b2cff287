// Rotary position embeddings as Hugging Face Llama applies them (rotate_half: channel i of a head
// pairs with channel i + D/2, not with its neighbour), on the CPU; the angles are
// model/rope_tables.h's.
#pragma once

#include "model/rope_tables.h"  // the angles the rotations turn by

namespace layup {

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
