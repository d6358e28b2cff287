// SwiGLU, the gated activation of Llama's MLP: silu(gate) * up.
#pragma once

namespace layup {

// gate_up [N, 2I] is the output of one fused matmul (gate_proj's I rows stacked above up_proj's):
// row n holds gate in channels [0, I) and up in [I, 2I), as attention's qkv holds q, k, v.
// out [N, I]: out[n,i] = silu(gate[n,i]) * up[n,i], silu(g) = g * sigmoid(g).
void swiglu_forward(float* out, const float* gate_up, int N, int I);

// Accumulates dgate_up [N, 2I] (the gate half and the up half) from dout [N, I], using gate_up.
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int N, int I);

}  // namespace layup
