// RMS normalization over the last dimension (Llama's RMSNorm: no mean subtraction, no bias).
#pragma once

namespace layup {

// out[n,:] = inp[n,:] * rstd[n] * weight, rstd = 1 / sqrt(mean_c(inp[n,c]^2) + eps).
// Writes out [N,C] and saves rstd [N] for the backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);

// Accumulates dinp [N,C] and dweight [C] from dout [N,C], using the saved rstd (as
// layernorm_backward does: both gradients are added to, never overwritten).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

}  // namespace layup
