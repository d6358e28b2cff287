// Layer normalization over the last dimension (biased variance, as PyTorch's nn.LayerNorm).
#pragma once

namespace layup {

// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * weight + bias, rstd = 1 / sqrt(var + eps).
// Writes out [N,C] and saves mean [N], rstd [N] for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps);

// Accumulates dinp [N,C], dweight [C], dbias [C] from dout [N,C], using the saved mean and rstd.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace layup
