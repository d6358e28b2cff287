// Fully connected layer: out = inp W^T + bias, with W stored [out_features, in_features].
#pragma once

namespace layup {

// out [N,OC] = inp [N,IC] weight[OC,IC]^T + bias [OC]. bias may be null (the tied LM head).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC);

// Accumulates dinp [N,IC] += dout weight, dweight [OC,IC] += dout^T inp, dbias [OC] += sum_n dout.
// dbias may be null.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC);

}  // namespace layup
