// The initialization of a fresh model: GPT-2's, or the Llama family's as transformers does it.
#pragma once

#include <cstdint>

#include "model/parameter_layout.h"

namespace layup {

// Fills params (layout.total_count() floats) as GPT-2 does: matrices and embeddings ~ N(0, 0.02),
// the two residual projections of each block ~ N(0, 0.02 / sqrt(2 n_layer)), biases 0, layer-norm
// gains 1; the Llama family's as transformers' _init_weights: every matrix and embedding
// ~ N(0, 0.02), norm gains 1, biases 0 (TensorSpec::init says which). The padded vocabulary rows
// of the token embedding (and an untied head) are 0. The result depends only on the seed.
void init_parameters(const ParameterLayout& layout, float* params, uint64_t seed);

// The same values for span `index` alone, into `span_params` (the span's count floats): what
// init_parameters writes at the span's offset.
void init_span_parameters(const ParameterLayout& layout, size_t index, float* span_params,
                          uint64_t seed);

}  // namespace layup
