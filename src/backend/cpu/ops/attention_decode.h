// Causal self-attention of new positions against a key/value cache: generation's attention, one
// sequence, the keys and values of earlier positions kept instead of recomputed.
#pragma once

namespace layup {

// qkv [T, (Hq+2Hkv)D]: the new positions' fused projection, rotary positions already applied
// (attention.h's layout). k_cache and v_cache [>= first + T, Hkv D] hold positions 0..first-1;
// this writes the new positions' keys and values at first..first+T-1, then
//   out[t, h] = sum_{u <= first+t} softmax_u(q[t,h] . k[u,h/g] / sqrt(D)) v[u,h/g],  g = Hq/Hkv,
// into out [T, Hq D]: attention.h's forward on the whole sequence, restricted to the new rows,
// up to the order of its sums.
void attention_decode_forward(float* out, float* k_cache, float* v_cache, const float* qkv, int T,
                              int first, int Hq, int Hkv, int D);

}  // namespace layup
