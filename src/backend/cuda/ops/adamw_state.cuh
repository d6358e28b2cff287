// AdamW on the device: the per-element arithmetic every AdamW kernel shares, and the kernels for
// bf16 and 8-bit optimizer state (optim/adamw_state.h), which give the CPU's scalar loop's bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>

#include "optim/adamw_state.h"

namespace layup::cuda {

// The CPU's AdamW element (optim/adamw_lanes.h), operation for operation: each product, sum,
// square root and division rounded once (the _rn intrinsics keep nvcc from fusing a product and
// a sum into an FMA, which rounds once for both). With the same constants, from adamw_constants,
// the GPU and the CPU update a parameter to the same bits.
__device__ inline void adamw_lane(float& param, float grad, float& m, float& v, float decay_factor,
                                  const AdamWConstants& c) {
  const float g = __fmul_rn(grad, c.grad_scale);
  const float m_i = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  const float v_i = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  m = m_i;
  v = v_i;
  const float denominator =
      __fadd_rn(__fmul_rn(__fsqrt_rn(v_i), c.inv_sqrt_bias_correction2), c.eps);
  param = __fsub_rn(__fmul_rn(param, decay_factor),
                    __fdiv_rn(__fmul_rn(c.step_size, m_i), denominator));
}

// Updates `count` elements of one run of bf16 or 8-bit state (a span), in place, in order with
// the other work on `stream`: `c` holds the decaying elements' factor, `decay` which decay (at
// most 32 runs). bf16_weights, when not null, receives the new weights rounded to bf16 (the
// compute copy). Throws layup::Error for fp32 state (cuda_device.cu's kernel) or too many runs.
void adamw_update_state(float* params, const float* grads, const AdamWMoments& moments,
                        size_t count, const AdamWConstants& c, std::span<const DecayRun> decay,
                        __nv_bfloat16* bf16_weights, cudaStream_t stream);

}  // namespace layup::cuda
