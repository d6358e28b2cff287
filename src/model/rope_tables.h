// The angles rotary position embeddings turn by (the Llama family): the inverse frequencies of a
// head's channel pairs, with Llama 3's rescaling, and the cos/sin tables of positions 0..T-1 that
// the CPU and CUDA backends' rotations read.
#pragma once

#include "model/model_config.h"  // RopeScaling

namespace layup {

// inv_freq [D/2]: theta^(-2i/D) for i in [0, D/2), then rescaled by Llama 3's rule where
// `scaling.llama3` (model_config.h). Throws layup::Error for an odd or non-positive head_dim or
// invalid scaling values.
void rope_inverse_frequencies(float* inv_freq, int head_dim, float theta,
                              const RopeScaling& scaling);

// cos, sin [T, D/2]: of the angle t * inv_freq[i] (rounded to float first, as transformers does),
// for positions t in [0, T). Built once; a table of T rows serves every sequence up to T long.
void rope_cos_sin(float* cos, float* sin, const float* inv_freq, int T, int head_dim);

}  // namespace layup
