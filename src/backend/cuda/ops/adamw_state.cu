// The bf16 and 8-bit AdamW kernels. Each computes what optim/adamw_state.cpp's scalar loop
// computes, with the same roundings: decoding is a table entry times the scale (one product) or
// a shift; the update is adamw_lane; an 8-bit block's scale is a maximum (exact, whatever the
// order of the reduction) and its codes are counts of thresholds below value / scale (one
// correctly rounded division), found by binary search; bf16 is rounded with the CPU's integer
// arithmetic. So the devices agree bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ops/adamw_state.cuh"
#include "backend/cuda/ops/common.cuh"
#include "core/error.h"

namespace layup::cuda {
namespace {

constexpr int kMaxDecayRuns = 32;
// One thread per value of an 8-bit block.
constexpr int kStateThreads = static_cast<int>(kOptimizerStateBlock);
static_assert(kStateThreads % 32 == 0 && kStateThreads <= 1024);
constexpr int kStateWarps = kStateThreads / 32;
// Blocks launched at most: each loops over its share of the state's blocks, so the maps are
// loaded into shared memory once per launched block, not once per state block.
constexpr size_t kMaxStateGrid = 2048;

struct DecayRunsTable {
  int count;
  size_t end[kMaxDecayRuns];
  bool decay[kMaxDecayRuns];
};

// The maps of optim/adamw_moments.h: m's entries and thresholds, then v's.
enum MapTable { kMValues, kMThresholds, kVValues, kVThresholds, kMapTables };
__constant__ float c_maps[kMapTables][256];

// The maps into this device's constant memory, once per device.
void upload_maps() {
  static std::mutex mutex;
  static std::vector<bool> uploaded;
  int device = 0;
  LAYUP_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  if (static_cast<size_t>(device) < uploaded.size() && uploaded[device]) return;
  float maps[kMapTables][256];
  const Blockwise8BitMap& m_map = signed_moment_map();
  const Blockwise8BitMap& v_map = unsigned_moment_map();
  std::copy(m_map.values, m_map.values + 256, maps[kMValues]);
  std::copy(m_map.thresholds, m_map.thresholds + 256, maps[kMThresholds]);
  std::copy(v_map.values, v_map.values + 256, maps[kVValues]);
  std::copy(v_map.thresholds, v_map.thresholds + 256, maps[kVThresholds]);
  LAYUP_CUDA_CHECK(cudaMemcpyToSymbol(c_maps, maps, sizeof maps));
  if (uploaded.size() <= static_cast<size_t>(device)) uploaded.resize(device + 1, false);
  uploaded[device] = true;
}

__device__ inline float decay_factor_at(const DecayRunsTable& runs, size_t i, float decaying) {
  for (int r = 0; r < runs.count; ++r)
    if (i < runs.end[r]) return runs.decay[r] ? decaying : 1.0f;
  return 1.0f;
}

// bf16_from_float (optim/adamw_moments.h).
__device__ inline uint16_t bf16_bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  if (x != x) return 0x7FFF;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

__device__ inline float from_bf16_bits(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// blockwise_8bit_code_by_search: the number of thresholds below y (0 for a NaN).
__device__ inline uint8_t code_of(const float* thresholds, float y) {
  unsigned code = 0;
#pragma unroll
  for (unsigned step = 128; step > 0; step /= 2)
    if (thresholds[code + step - 1] < y) code += step;
  return static_cast<uint8_t>(code);
}

__global__ void adamw_bf16_kernel(float* params, const float* grads, uint16_t* m, uint16_t* v,
                                  __nv_bfloat16* bf16, size_t count, DecayRunsTable runs,
                                  AdamWConstants c) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float p = params[i], m_i = from_bf16_bits(m[i]), v_i = from_bf16_bits(v[i]);
    adamw_lane(p, grads[i], m_i, v_i, decay_factor_at(runs, i, c.decay_factor), c);
    params[i] = p;
    m[i] = bf16_bits(m_i);
    v[i] = bf16_bits(v_i);
    if (bf16) bf16[i] = __float2bfloat16(p);
  }
}

// The largest of every thread's `x` in the block (NaNs ignored: fmaxf returns the other operand,
// as the CPU's max does, and 0 starts it). Every thread returns it. `warp_largest` is shared.
__device__ inline float block_largest(float x, float* warp_largest) {
  float largest = fmaxf(0.0f, fabsf(x));
  for (int offset = 16; offset > 0; offset /= 2)
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = largest;
  __syncthreads();
  largest = 0.0f;
  for (int w = 0; w < kStateWarps; ++w) largest = fmaxf(largest, warp_largest[w]);
  return largest;
}

// One 8-bit block per iteration, one thread per value: decode, update (weights written), the new
// scales, then the codes. In place, every thread reads the block's old scales before the first
// __syncthreads of block_largest, and thread 0 writes the new ones after it.
__global__ void __launch_bounds__(kStateThreads)
    adamw_8bit_kernel(float* params, const float* grads, uint8_t* m_codes, uint8_t* v_codes,
                      float* m_scales, float* v_scales, __nv_bfloat16* bf16, size_t count,
                      DecayRunsTable runs, AdamWConstants c) {
  __shared__ float maps[kMapTables][256];
  __shared__ float warp_largest[2][kStateWarps];
  for (int k = threadIdx.x; k < kMapTables * 256; k += blockDim.x)
    (&maps[0][0])[k] = (&c_maps[0][0])[k];
  __syncthreads();
  const size_t blocks = (count + kStateThreads - 1) / kStateThreads;
  for (size_t block = blockIdx.x; block < blocks; block += gridDim.x) {
    const size_t i = block * kStateThreads + threadIdx.x;
    const bool live = i < count;
    float m = 0.0f, v = 0.0f;  // the new moments; 0 past the end, never the largest
    if (live) {
      float p = params[i];
      m = __fmul_rn(maps[kMValues][m_codes[i]], m_scales[block]);
      v = __fmul_rn(maps[kVValues][v_codes[i]], v_scales[block]);
      adamw_lane(p, grads[i], m, v, decay_factor_at(runs, i, c.decay_factor), c);
      params[i] = p;
      if (bf16) bf16[i] = __float2bfloat16(p);
    }
    const float m_scale = block_largest(m, warp_largest[0]);
    const float v_scale = block_largest(v, warp_largest[1]);
    if (threadIdx.x == 0) {
      m_scales[block] = m_scale;
      v_scales[block] = v_scale;
    }
    if (live) {
      m_codes[i] = code_of(maps[kMThresholds], __fdiv_rn(m, m_scale > 0.0f ? m_scale : 1.0f));
      v_codes[i] = code_of(maps[kVThresholds], __fdiv_rn(v, v_scale > 0.0f ? v_scale : 1.0f));
    }
    __syncthreads();  // warp_largest is the next block's
  }
}

}  // namespace

void adamw_update_state(float* params, const float* grads, const AdamWMoments& moments,
                        size_t count, const AdamWConstants& c, std::span<const DecayRun> decay,
                        __nv_bfloat16* bf16_weights, cudaStream_t stream) {
  LAYUP_CHECK(moments.kind != OptimizerStateKind::kFp32,
              "fp32 optimizer state has its own AdamW kernel");
  LAYUP_CHECK(decay.size() <= kMaxDecayRuns, "a span of ", decay.size(),
              " runs of tensors that decay alike is more than the AdamW kernel takes (",
              kMaxDecayRuns, ")");
  LAYUP_CHECK(count == 0 || (!decay.empty() && decay.back().end >= count),
              "AdamW's decay runs do not cover the ", count, " elements");
  if (count == 0) return;
  DecayRunsTable runs{};
  runs.count = static_cast<int>(decay.size());
  for (size_t r = 0; r < decay.size(); ++r) {
    runs.end[r] = decay[r].end;
    runs.decay[r] = decay[r].decay;
  }
  if (moments.kind == OptimizerStateKind::kBf16) {
    constexpr int kThreads = 256;
    const size_t grid = std::min<size_t>(ceil_div(count, size_t{kThreads}), 8192);
    adamw_bf16_kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        params, grads, moments.m_bf16(), moments.v_bf16(), bf16_weights, count, runs, c);
    LAYUP_CUDA_CHECK_LAUNCH();
    return;
  }
  upload_maps();
  const size_t grid = std::min(ceil_div(count, size_t{kStateThreads}), kMaxStateGrid);
  adamw_8bit_kernel<<<static_cast<unsigned>(grid), kStateThreads, 0, stream>>>(
      params, grads, moments.m_codes(), moments.v_codes(), moments.m_scales, moments.v_scales,
      bf16_weights, count, runs, c);
  LAYUP_CUDA_CHECK_LAUNCH();
}

}  // namespace layup::cuda
