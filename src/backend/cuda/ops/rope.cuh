// Rotary position embeddings on the GPU, as the CPU op applies them (backend/cpu/ops/rope.h):
// channel i < D/2 of a head pairs with i + D/2 and turns by the angle of position t. The cos and
// sin tables [T, D/2] are fp32 and made on the host (rope_inverse_frequencies, rope_cos_sin); the
// rows are T (float or __nv_bfloat16), rotated in fp32.
#pragma once

#include <cuda_runtime_api.h>

namespace layup::cuda {

// Rotates, in place, the first `heads` heads (D floats each) of each of the B*T rows of `rows`
// (row_stride elements apart), row (b,t) by position t: for the fused qkv [B,T,(Hq+2Hkv)D], heads
// = Hq + Hkv covers q and k and leaves v.
template <class T>
void rope_forward(T* rows, const float* cos, const float* sin, int B, int T_, int heads,
                  int head_dim, int row_stride, cudaStream_t stream);

// The backward: the rotation by the negative angle, in place on the gradient (it overwrites, as
// the CPU op does).
template <class T>
void rope_backward(T* rows, const float* cos, const float* sin, int B, int T_, int heads,
                   int head_dim, int row_stride, cudaStream_t stream);

}  // namespace layup::cuda
