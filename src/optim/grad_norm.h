// Global gradient norm and the clip factor derived from it.
#pragma once

#include <cstddef>

namespace layup {

// Sum of squares of x in double. The order of additions is fixed (chunks of a fixed size,
// summed in index order) whatever the number of threads, so the result is bitwise reproducible:
// the resume and mode-equivalence guarantees depend on that.
double sum_of_squares(const float* x, size_t count);

// The factor torch.nn.utils.clip_grad_norm_ multiplies gradients by: max_norm / (norm + 1e-6)
// when that is below 1, else 1. max_norm <= 0 means no clipping.
float clip_factor(double total_norm, float max_norm);

}  // namespace layup
