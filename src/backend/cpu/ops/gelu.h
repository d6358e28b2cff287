// GELU, tanh approximation (GPT-2's gelu_new).
#pragma once

namespace layup {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over N values.
void gelu_forward(float* out, const float* inp, int N);

// Accumulates dinp += gelu'(inp) * dout, elementwise over N values.
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);

}  // namespace layup
