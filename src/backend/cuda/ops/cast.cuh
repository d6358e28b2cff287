// fp32 -> bf16 conversion: the bf16 compute copy of the fp32 master weights.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace layup::cuda {

// out[i] = bf16(inp[i]) (round to nearest even) for i < count.
void cast_to_bf16(__nv_bfloat16* out, const float* inp, size_t count, cudaStream_t stream);

}  // namespace layup::cuda
