// fp32 -> bf16 conversion, 8 elements (one 16-byte store) per thread where alignment allows.
#include "backend/cuda/ops/cast.cuh"
#include "backend/cuda/ops/common.cuh"

namespace layup::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void cast_to_bf16_packed_kernel(__nv_bfloat16* out, const float* inp, size_t packs) {
  using OutPack = Pack<__nv_bfloat16>;
  for (size_t p = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t first = p * OutPack::kSize;
    const Pack<float> low = load_pack(inp + first), high = load_pack(inp + first + 4);
    OutPack result;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      result.v[i] = __float2bfloat16(low.v[i]);
      result.v[i + 4] = __float2bfloat16(high.v[i]);
    }
    store_pack(out + first, result);
  }
}

__global__ void cast_to_bf16_kernel(__nv_bfloat16* out, const float* inp, size_t begin,
                                    size_t count) {
  for (size_t i = begin + blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(inp[i]);
}

}  // namespace

void cast_to_bf16(__nv_bfloat16* out, const float* inp, size_t count, cudaStream_t stream) {
  size_t done = 0;
  if (is_aligned16(out) && is_aligned16(inp)) {
    const size_t packs = count / Pack<__nv_bfloat16>::kSize;
    if (packs > 0) {
      cast_to_bf16_packed_kernel<<<grid_for(packs, kThreads), kThreads, 0, stream>>>(out, inp,
                                                                                     packs);
      LAYUP_CUDA_CHECK_LAUNCH();
    }
    done = packs * Pack<__nv_bfloat16>::kSize;
  }
  if (done < count) {
    cast_to_bf16_kernel<<<grid_for(count - done, kThreads), kThreads, 0, stream>>>(out, inp, done,
                                                                                   count);
    LAYUP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace layup::cuda
