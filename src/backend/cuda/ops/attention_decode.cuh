// Causal self-attention of new positions against a key/value cache, on the GPU: generation's
// attention (ModelBackend::decode), the same math as the CPU op
// (backend/cpu/ops/attention_decode.h). T is float or __nv_bfloat16 (the cache too); all arithmetic
// is fp32.
#pragma once

#include <cuda_runtime_api.h>

namespace layup::cuda {

// qkv [T_, (Hq+2Hkv)D]: the new positions' fused projection, rotary positions applied. k_cache and
// v_cache [>= first + T_, Hkv D] hold positions 0..first-1; this writes the new positions' keys
// and values at first..first+T_-1, then out [T_, Hq D]:
//   out[t, h] = sum_{u <= first+t} softmax_u(q[t,h] . k[u,h/g] / sqrt(D)) v[u,h/g],  g = Hq/Hkv.
// D is at most kMaxAttentionHeadDim (attention.cuh).
template <class T>
void attention_decode_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int T_, int first,
                              int Hq, int Hkv, int D, cudaStream_t stream);

}  // namespace layup::cuda
