// Softmax cross-entropy over the real vocabulary of padded logits, on the GPU. Same math and the
// same split as the CPU op (backend/cpu/ops/classifier.h); logits are T (float or __nv_bfloat16),
// everything else fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace layup::cuda {

// For N rows of Vp logits, over the first V columns (the padding is never read):
//   lse[n]    = log sum_{v<V} exp(logits[n, v])      saved for the backward
//   losses[n] = lse[n] - logits[n, targets[n]]
// targets in device memory. A row whose target is below 0 is not learned: its loss and lse are 0.
template <class T>
void classifier_forward(float* losses, float* lse, const T* logits, const int32_t* targets, int N,
                        int V, int Vp, cudaStream_t stream);

// Writes (does not accumulate):
//   dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [v == targets[n]]) * dloss   for v < V
//   dlogits[n, v] = 0                                                          for V <= v < Vp
// and 0 in every column of a row whose target is below 0. dlogits may be the logits buffer itself:
// each element is read, then overwritten, by one thread, so the softmax is never materialized
// anywhere but in place.
template <class T>
void classifier_backward(T* dlogits, const T* logits, const float* lse, const int32_t* targets,
                         int N, int V, int Vp, float dloss, cudaStream_t stream);

}  // namespace layup::cuda
