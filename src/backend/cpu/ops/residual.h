// Residual connection: the sum of a block's input and its branch.
#pragma once

namespace layup {

// out = inp1 + inp2, elementwise over N values.
void residual_forward(float* out, const float* inp1, const float* inp2, int N);

// A sum passes its gradient to both inputs unchanged: dinp1 += dout, dinp2 += dout.
void residual_backward(float* dinp1, float* dinp2, const float* dout, int N);

}  // namespace layup
