// Softmax cross-entropy over the real vocabulary of padded logits: GPT-2's loss.
#pragma once

#include <cstdint>

namespace layup {

// For N rows of Vp logits, over the first V columns (the padding is ignored, whatever it holds):
//   lse[n]    = log sum_{v<V} exp(logits[n, v])      saved for the backward
//   losses[n] = lse[n] - logits[n, targets[n]]
// A row whose target is below 0 is not learned: its loss and lse are 0 (its logits are not read).
void classifier_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                        int N, int V, int Vp);

// Writes (does not accumulate) the gradient of sum_n dloss * losses[n]:
//   dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v == targets[n]]) * dloss   for v < V
//   dlogits[n, v] = 0                                                          for V <= v < Vp
// A row whose target is below 0 gets exactly 0 in every column. For the mean loss over the
// learned rows scaled by loss_scale, dloss = loss_scale / (learned rows). dlogits may be the logits
// buffer itself (the softmax is then computed in place).
void classifier_backward(float* dlogits, const float* logits, const float* lse,
                         const int32_t* targets, int N, int V, int Vp, float dloss);

}  // namespace layup
