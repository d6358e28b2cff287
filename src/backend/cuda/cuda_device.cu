// The CUDA device: memory, copies, the deterministic sum of squares and the fused AdamW kernels.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_fence.h"
#include "backend/cuda/cuda_memory.h"
#include "backend/cuda/nccl_collectives.h"
#include "backend/cuda/ops/adamw_state.cuh"
#include "backend/cuda/ops/cast.cuh"
#include "backend/cuda/ops/common.cuh"
#include "optim/adamw_simd.h"
#include "optim/grad_norm.h"

namespace layup {
namespace {

bool ranks_share_devices = false;  // set_ranks_share_cuda_devices
bool gpu_shared_by_ranks = false;  // this rank took a GPU another rank of its host has

using cuda::adamw_lane;
using cuda::ceil_div;

__global__ void probe_kernel() {}

// ---- Sum of squares ---------------------------------------------------------------------------
//
// A fixed grid (never sized from the GPU), each thread summing its grid-stride share in double in
// index order, a fixed reduction tree inside each block, and the per-block partials summed in
// block order by one thread of a second kernel: the same input gives the same bits on every run
// and every GPU, whether the result is read back at once or later through a fence.

constexpr int kSumBlocks = kCudaDeviceNormPartials;  // cuda_device_buffers lists the partials
constexpr int kSumThreads = 256;

// Every thread's `sum` of a kSumThreads block added in a fixed tree: each warp's lanes, then its
// warps in order; the total is thread 0's.
__device__ double block_sum(double sum) {
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[kSumThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kSumThreads / 32; ++w) total += warp_sums[w];
  return total;
}

__global__ void __launch_bounds__(kSumThreads)
    sum_of_squares_kernel(double* partials, const float* x, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  double sum = 0.0;
  // 16-byte loads over the aligned body, then the scalar rest.
  const size_t packs = cuda::is_aligned16(x) ? count / 4 : 0;
  for (size_t p = first; p < packs; p += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[p];
    sum += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
           static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
  }
  for (size_t i = packs * 4 + first; i < count; i += stride)
    sum += static_cast<double>(x[i]) * x[i];

  const double total = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// partials[0 .. kSumBlocks) added in block order into *result, which may be partials[0] itself
// (read before it is written) or host memory the GPU can write (pinned, unified addressing).
__global__ void __launch_bounds__(kSumBlocks)
    add_partials_kernel(double* result, const double* partials) {
  __shared__ double loaded[kSumBlocks];
  loaded[threadIdx.x] = partials[threadIdx.x];  // all loads in flight at once
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  for (int b = 0; b < kSumBlocks; ++b) total += loaded[b];
  *result = total;
}

// One block a chunk (optim/grad_norm.h's kSumOfSquaresChunk elements): chunk first_chunk +
// blockIdx.x of x summed in double into sums[blockIdx.x], each warp's lanes then its warps in
// order.
__global__ void __launch_bounds__(kSumThreads)
    chunk_sums_kernel(double* sums, const float* x, size_t count, size_t first_chunk) {
  const size_t begin = (first_chunk + blockIdx.x) * kSumOfSquaresChunk;
  const size_t end = begin + kSumOfSquaresChunk < count ? begin + kSumOfSquaresChunk : count;
  double sum = 0.0;
  for (size_t i = begin + threadIdx.x; i < end; i += kSumThreads)
    sum += static_cast<double>(x[i]) * x[i];
  const double total = block_sum(sum);
  if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

// ---- AdamW ------------------------------------------------------------------------------------
//
// One pass over each element: scale the gradient (global-norm clipping), update both moments,
// decay (matrices only) and step; the formula of optim/adamw.cpp, operation for operation. One
// launch per span. Its tensors differ in size by up to 4000x (a block's biases against its MLP
// matrices), so the grid is not shaped by the largest: each tensor gets as many blocks as its
// elements need (first_block gives each tensor's first), and every launched block has a full
// share of work. A grid sized by the largest tensor left most blocks of the small tensors idle,
// which held the kernel at 2.5-2.9 TB/s on the H200.

constexpr int kMaxTensorsPerLaunch = 16;
constexpr int kAdamThreads = 256;
constexpr int kAdamPacksPerThread = 4;  // float4s each thread updates: 4096 elements per block
constexpr size_t kAdamBlockElements = size_t{kAdamThreads} * 4 * kAdamPacksPerThread;

struct AdamWTensors {
  int count;
  size_t offset[kMaxTensorsPerLaunch];
  size_t size[kMaxTensorsPerLaunch];
  float decay_factor[kMaxTensorsPerLaunch];  // 1 - lr wd, or 1 where the tensor does not decay
  // Blocks [first_block[k], first_block[k + 1]) update tensor k; first_block[count] is the grid.
  unsigned first_block[kMaxTensorsPerLaunch + 1];
};

// Each element is adamw_lane (ops/adamw_state.cuh): the CPU's AdamW element, operation for
// operation, so that with the same constants the GPU and the CPU update a parameter to the same
// bits, and the modes differ only where their gradient norms do.

// Memory-bound (28 bytes per parameter, 30 with the bf16 copy). Block b of tensor k updates
// elements [b, b + 1) x kAdamBlockElements of it, as float4s where the tensor starts on a 16-byte
// boundary (a block's share starts on a multiple of 4 elements, so then every pack is aligned),
// else one by one. bf16 (may be null) receives the new weights rounded to bf16.
__global__ void __launch_bounds__(kAdamThreads)
    adamw_kernel(float* params, const float* grads, float* m, float* v, __nv_bfloat16* bf16,
                 AdamWTensors tensors, AdamWConstants s) {
  int tensor = 0;
  while (blockIdx.x >= tensors.first_block[tensor + 1]) ++tensor;  // at most 16 steps, uniform
  const size_t offset = tensors.offset[tensor], size = tensors.size[tensor];
  const float decay_factor = tensors.decay_factor[tensor];
  const size_t begin = (blockIdx.x - tensors.first_block[tensor]) * kAdamBlockElements;
  const size_t end = min(size, begin + kAdamBlockElements);
  params += offset;
  grads += offset;
  m += offset;
  v += offset;
  if (bf16) bf16 += offset;
  const bool aligned = cuda::is_aligned16(params) && cuda::is_aligned16(grads) &&
                       cuda::is_aligned16(m) && cuda::is_aligned16(v) &&
                       reinterpret_cast<uintptr_t>(bf16) % 8 == 0;
  const size_t vector_end = aligned ? begin + (end - begin) / 4 * 4 : begin;
  for (size_t i = begin + threadIdx.x * 4; i < vector_end; i += kAdamThreads * 4) {
    float4 p = *reinterpret_cast<float4*>(params + i);
    const float4 g = *reinterpret_cast<const float4*>(grads + i);
    float4 m4 = *reinterpret_cast<float4*>(m + i);
    float4 v4 = *reinterpret_cast<float4*>(v + i);
    adamw_lane(p.x, g.x, m4.x, v4.x, decay_factor, s);
    adamw_lane(p.y, g.y, m4.y, v4.y, decay_factor, s);
    adamw_lane(p.z, g.z, m4.z, v4.z, decay_factor, s);
    adamw_lane(p.w, g.w, m4.w, v4.w, decay_factor, s);
    *reinterpret_cast<float4*>(params + i) = p;
    *reinterpret_cast<float4*>(m + i) = m4;
    *reinterpret_cast<float4*>(v + i) = v4;
    if (bf16) {
      // Four bf16 values, one 8-byte store; __float2bfloat16 rounds as cast_to_bf16 does.
      const __nv_bfloat162 low = __floats2bfloat162_rn(p.x, p.y);
      const __nv_bfloat162 high = __floats2bfloat162_rn(p.z, p.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned*>(&low);
      packed.y = *reinterpret_cast<const unsigned*>(&high);
      *reinterpret_cast<uint2*>(bf16 + i) = packed;
    }
  }
  for (size_t i = vector_end + threadIdx.x; i < end; i += kAdamThreads) {
    adamw_lane(params[i], grads[i], m[i], v[i], decay_factor, s);
    if (bf16) bf16[i] = __float2bfloat16(params[i]);
  }
}

// Nothing: launched on the legacy stream after a wait, so that the blocking streams' later work
// (the backend's) waits too.
__global__ void ordering_kernel() {}

__global__ void add_kernel(float* dst, const float* src, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

// Waits until everything issued on `stream` so far is done, sleeping rather than spinning: the
// waiting thread shares the cores with the CPU AdamW workers.
void wait_for_stream(cudaStream_t stream) {
  cudaEvent_t done = nullptr;
  LAYUP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming | cudaEventBlockingSync));
  const cudaError_t recorded = cudaEventRecord(done, stream);
  const cudaError_t synced = recorded == cudaSuccess ? cudaEventSynchronize(done) : recorded;
  cudaEventDestroy(done);
  LAYUP_CUDA_CHECK(synced);
}

// cudaLaunchHostFunc's callback: runs a copy's `landed` and frees it. It runs on CUDA's callback
// thread, where nothing may throw.
void CUDART_CB run_landed(void* data) {
  std::unique_ptr<std::function<void()>> landed(static_cast<std::function<void()>*>(data));
  try {
    (*landed)();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layup: a copy's completion handler failed: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "layup: a copy's completion handler failed\n");
  }
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(std::shared_ptr<MemoryAccountant> accountant)
      : Device(std::move(accountant)) {
    int device = 0;
    LAYUP_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp properties{};
    LAYUP_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    name_ = "cuda:" + std::to_string(device) + " (" + properties.name + ")";
    // Allocated as cuda_device_buffers lists it, the list the memory plan sums.
    const PlannedAllocation partials = cuda_device_buffers().at(0);
    partials_ = static_cast<double*>(cuda_allocate(partials.bytes, partials.kind, partials.what));
    partials_record_ = record_planned(Device::accountant(), partials);
    // Non-blocking: a copy on them waits for its fence only, not for all the compute issued since.
    // One per direction, so that a gradient leaving is never queued behind weights arriving.
    LAYUP_CUDA_CHECK(cudaStreamCreateWithFlags(&to_host_stream_, cudaStreamNonBlocking));
    LAYUP_CUDA_CHECK(cudaStreamCreateWithFlags(&to_device_stream_, cudaStreamNonBlocking));
    // The streamed blocks' fills, never queued behind an update's weights landing.
    LAYUP_CUDA_CHECK(cudaStreamCreateWithFlags(&weights_in_stream_, cudaStreamNonBlocking));
  }
  ~CudaDevice() override {
    // Copies (and their completion handlers) still in flight finish first.
    cudaStreamSynchronize(to_host_stream_);
    cudaStreamSynchronize(to_device_stream_);
    cudaStreamSynchronize(weights_in_stream_);
    cudaStreamDestroy(to_host_stream_);
    cudaStreamDestroy(to_device_stream_);
    cudaStreamDestroy(weights_in_stream_);
    cudaFree(partials_);
  }

  std::string name() const override { return name_; }
  MemoryKind memory_kind() const override { return MemoryKind::kDevice; }
  MemoryKind host_memory_kind() const override { return MemoryKind::kPinnedMapped; }

  std::vector<uint8_t> new_collectives_id() override { return new_nccl_id(); }
  std::unique_ptr<DeviceCollectives> join_collectives(const std::vector<uint8_t>& id, int rank,
                                                      int ranks) override {
    LAYUP_CHECK(!gpu_shared_by_ranks,
                "this run sums gradients in GPU memory over NCCL (gpu mode, or layup's "
                "device-updated spans), and LAYUP_RANKS_SHARE_GPUS put two ranks on one GPU, "
                "which NCCL refuses; start a rank a GPU, or keep every update on the host "
                "(offload, or layup with --layup-head host and no device:N placement)");
    return make_nccl_collectives(*this, id, rank, ranks);
  }

  DeviceBuffer allocate_kind(size_t count, TensorClass tensor_class, MemorySide side,
                             MemoryKind kind) override {
    auto* data = static_cast<float*>(
        cuda_allocate(count * sizeof(float), kind, tensor_class_label(tensor_class)));
    return DeviceBuffer(this, data, count, record(count, tensor_class, side, kind), kind);
  }

  void release(float* data, MemoryKind kind) override { cuda_free(data, kind); }

  void copy_to_device(float* dst, const float* src, size_t count) override {
    LAYUP_CUDA_CHECK(cudaMemcpy(dst, src, count * sizeof(float), cudaMemcpyDefault));
  }
  void copy_to_host(float* dst, const float* src, size_t count) override {
    LAYUP_CUDA_CHECK(cudaMemcpy(dst, src, count * sizeof(float), cudaMemcpyDefault));
  }
  std::shared_ptr<const DeviceFence> fence() override { return std::make_shared<CudaFence>(); }

  void wait_for(const DeviceFence& fence) override {
    LAYUP_CUDA_CHECK(cudaEventSynchronize(static_cast<const CudaFence&>(fence).event()));
  }

  void copy_to_host_after(const DeviceFence& after, float* dst, const float* src,
                          size_t count) override {
    LAYUP_CUDA_CHECK(
        cudaStreamWaitEvent(to_host_stream_, static_cast<const CudaFence&>(after).event(), 0));
    LAYUP_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDefault, to_host_stream_));
    wait_for_stream(to_host_stream_);
  }

  void copy_to_device_async(float* dst, const float* src, size_t count,
                            std::function<void()> landed) override {
    LAYUP_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDefault, to_device_stream_));
    auto handler = std::make_unique<std::function<void()>>(std::move(landed));
    LAYUP_CUDA_CHECK(cudaLaunchHostFunc(to_device_stream_, run_landed, handler.get()));
    handler.release();  // run_landed owns it now
  }

  void copy_to_host_async(const DeviceFence& after, void* dst, const void* src, size_t bytes,
                          std::function<void()> landed) override {
    LAYUP_CUDA_CHECK(
        cudaStreamWaitEvent(to_host_stream_, static_cast<const CudaFence&>(after).event(), 0));
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_host_stream_));
    if (!landed) return;
    auto handler = std::make_unique<std::function<void()>>(std::move(landed));
    LAYUP_CUDA_CHECK(cudaLaunchHostFunc(to_host_stream_, run_landed, handler.get()));
    handler.release();  // run_landed owns it now
  }
  std::shared_ptr<const DeviceFence> copy_to_device_after(const DeviceFence* after, void* dst,
                                                          const void* src, size_t bytes) override {
    if (after != nullptr)
      LAYUP_CUDA_CHECK(cudaStreamWaitEvent(weights_in_stream_,
                                           static_cast<const CudaFence*>(after)->event(), 0));
    LAYUP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, weights_in_stream_));
    return std::make_shared<CudaFence>(weights_in_stream_);
  }

  void order_after(const DeviceFence& fence) override {
    LAYUP_CUDA_CHECK(
        cudaStreamWaitEvent(cudaStreamLegacy, static_cast<const CudaFence&>(fence).event(), 0));
    ordering_kernel<<<1, 1, 0, cudaStreamLegacy>>>();
    LAYUP_CUDA_CHECK_LAUNCH();
  }

  void copy_to_compute_copy_async(void* bf16_dst, const float* src, size_t count, float* staging,
                                  size_t staging_count, std::function<void()> landed) override {
    LAYUP_CHECK(staging_count > 0, "no staging buffer for the weights' transfer");
    // One stream: a piece's copy waits for the previous piece's cast, which read the staging.
    auto* out = static_cast<__nv_bfloat16*>(bf16_dst);
    for (size_t begin = 0; begin < count; begin += staging_count) {
      const size_t piece = std::min(staging_count, count - begin);
      LAYUP_CUDA_CHECK(cudaMemcpyAsync(staging, src + begin, piece * sizeof(float),
                                       cudaMemcpyDefault, to_device_stream_));
      cuda::cast_to_bf16(out + begin, staging, piece, to_device_stream_);
    }
    auto handler = std::make_unique<std::function<void()>>(std::move(landed));
    LAYUP_CUDA_CHECK(cudaLaunchHostFunc(to_device_stream_, run_landed, handler.get()));
    handler.release();  // run_landed owns it now
  }

  void cast_to_compute_copy(void* bf16_dst, const float* src, size_t count) override {
    cuda::cast_to_bf16(static_cast<__nv_bfloat16*>(bf16_dst), src, count, cudaStreamLegacy);
  }

  void fill_zero(float* dst, size_t count) override {
    LAYUP_CUDA_CHECK(cudaMemsetAsync(dst, 0, count * sizeof(float), cudaStreamLegacy));
  }

  void add(float* dst, const float* src, size_t count) override {
    if (count == 0) return;
    const size_t blocks = std::min<size_t>((count + 255) / 256, 65536);
    add_kernel<<<static_cast<unsigned>(blocks), 256, 0, cudaStreamLegacy>>>(dst, src, count);
    LAYUP_CUDA_CHECK_LAUNCH();
  }

  double sum_of_squares(const float* x, size_t count) override {
    start_sum_of_squares(x, count, partials_);
    double total = 0.0;
    LAYUP_CUDA_CHECK(cudaMemcpy(&total, partials_, sizeof(double), cudaMemcpyDeviceToHost));
    return total;
  }

  void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk, size_t end_chunk,
                             double* chunk_sums) override {
    if (end_chunk <= first_chunk) return;
    const size_t chunks = end_chunk - first_chunk;
    // A few KiB even at the largest span (8,000 chunks at 525M elements): allocated a call.
    double* sums = nullptr;
    LAYUP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&sums), chunks * sizeof(double),
                                     cudaStreamLegacy));
    chunk_sums_kernel<<<static_cast<unsigned>(chunks), kSumThreads, 0, cudaStreamLegacy>>>(
        sums, x, count, first_chunk);
    LAYUP_CUDA_CHECK_LAUNCH();
    const cudaError_t copied =
        cudaMemcpyAsync(chunk_sums + first_chunk, sums, chunks * sizeof(double),
                        cudaMemcpyDeviceToHost, cudaStreamLegacy);
    cudaFreeAsync(sums, cudaStreamLegacy);
    LAYUP_CUDA_CHECK(copied);
    LAYUP_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  void start_sum_of_squares(const float* x, size_t count, double* result) override {
    // Both kernels on the legacy stream, in order with the work issued before and with the next
    // call's kernels, which reuse the partials.
    sum_of_squares_kernel<<<kSumBlocks, kSumThreads, 0, cudaStreamLegacy>>>(partials_, x, count);
    LAYUP_CUDA_CHECK_LAUNCH();
    add_partials_kernel<<<1, kSumBlocks, 0, cudaStreamLegacy>>>(result, partials_);
    LAYUP_CUDA_CHECK_LAUNCH();
  }

  void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                         const float* grads, float* m, float* v, const AdamWStep& step,
                         void* bf16_weights) override {
    // The CPU's constants (optim/adamw_simd.h): the same values, so the same bits.
    const AdamWConstants constants = adamw_constants(step, /*decay=*/true);
    std::vector<AdamWRange> ranges;
    for (const TensorSpec& tensor : layout.tensors_in(span))
      ranges.push_back({tensor.offset_in_span, tensor.count, tensor.weight_decay});
    launch_adamw(ranges, params, grads, m, v, static_cast<__nv_bfloat16*>(bf16_weights), constants);
  }

  void adamw_update_span_state(const ParameterLayout& layout, const Span& span, float* params,
                               const float* grads, const AdamWMoments& moments,
                               const AdamWStep& step, void* bf16_weights) override {
    if (moments.kind == OptimizerStateKind::kFp32) {
      adamw_update_span(layout, span, params, grads, moments.m_fp32(), moments.v_fp32(), step,
                        bf16_weights);
      return;
    }
    // On the legacy stream, in order with the device's other work, like the fp32 kernel.
    const std::vector<DecayRun> decay = decay_runs(layout, span, 0, span.count);
    cuda::adamw_update_state(params, grads, moments, span.count, adamw_constants(step, true), decay,
                             static_cast<__nv_bfloat16*>(bf16_weights), cudaStreamLegacy);
  }

  // Elements [first, first + count) of the span; every pointer at the part's first element.
  void adamw_update_span_part_state(const ParameterLayout& layout, const Span& span, size_t first,
                                    size_t count, float* params, const float* grads,
                                    const AdamWMoments& moments, const AdamWStep& step,
                                    void* bf16_weights) override {
    check_state_part(moments.kind, span, first, count);
    const AdamWConstants constants = adamw_constants(step, /*decay=*/true);
    const std::vector<DecayRun> decay = decay_runs(layout, span, first, count);
    auto* bf16 = static_cast<__nv_bfloat16*>(bf16_weights);
    if (moments.kind != OptimizerStateKind::kFp32) {
      cuda::adamw_update_state(params, grads, moments, count, constants, decay, bf16,
                               cudaStreamLegacy);
      return;
    }
    // fp32: each run of elements that decay alike as one tensor of the span kernel's batch.
    std::vector<AdamWRange> ranges;
    for (size_t r = 0; r < decay.size(); ++r) {
      const size_t begin = r == 0 ? 0 : decay[r - 1].end;
      const size_t end = std::min(decay[r].end, count);
      if (end > begin) ranges.push_back({begin, end - begin, decay[r].decay});
    }
    launch_adamw(ranges, params, grads, moments.m_fp32(), moments.v_fp32(), bf16, constants);
  }

 private:
  // Elements [offset, offset + count) of the buffers, decayed or not.
  struct AdamWRange {
    size_t offset = 0, count = 0;
    bool decay = false;
  };

  // adamw_kernel over `ranges`, kMaxTensorsPerLaunch of them a launch, on the legacy stream.
  static void launch_adamw(const std::vector<AdamWRange>& ranges, float* params, const float* grads,
                           float* m, float* v, __nv_bfloat16* bf16,
                           const AdamWConstants& constants) {
    for (size_t first = 0; first < ranges.size(); first += kMaxTensorsPerLaunch) {
      AdamWTensors batch{};
      size_t blocks = 0;
      for (size_t i = first; i < std::min(ranges.size(), first + kMaxTensorsPerLaunch); ++i) {
        const int k = batch.count++;
        batch.offset[k] = ranges[i].offset;
        batch.size[k] = ranges[i].count;
        batch.decay_factor[k] = ranges[i].decay ? constants.decay_factor : 1.0f;
        batch.first_block[k] = static_cast<unsigned>(blocks);
        blocks += ceil_div(ranges[i].count, kAdamBlockElements);
      }
      batch.first_block[batch.count] = static_cast<unsigned>(blocks);
      if (blocks == 0) continue;
      LAYUP_CHECK(blocks < (size_t{1} << 31), "AdamW over ", blocks, " blocks of ",
                  kAdamBlockElements, " parameters is too large for one launch");
      adamw_kernel<<<static_cast<unsigned>(blocks), kAdamThreads, 0, cudaStreamLegacy>>>(
          params, grads, m, v, bf16, batch, constants);
      LAYUP_CUDA_CHECK_LAUNCH();
    }
  }

  std::string name_;
  double* partials_ = nullptr;  // [kSumBlocks]
  MemoryRecord partials_record_;
  cudaStream_t to_host_stream_ = nullptr, to_device_stream_ = nullptr, weights_in_stream_ = nullptr;
};

}  // namespace

void use_cuda_device_of_local_rank(int local_rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // no GPU: the run resolves to the CPU, or says why it cannot
    return;
  }
  LAYUP_CHECK(local_rank < count || ranks_share_devices, "rank ", local_rank,
              " of this host has no GPU of its own: ", count,
              " visible (CUDA_VISIBLE_DEVICES); start at most ", count,
              " ranks a host (or set LAYUP_RANKS_SHARE_GPUS=1 to let ranks share them)");
  gpu_shared_by_ranks = local_rank >= count;
  LAYUP_CUDA_CHECK(cudaSetDevice(local_rank % count));
}

void set_ranks_share_cuda_devices(bool share) {
  ranks_share_devices = share;
}

bool cuda_device_available(std::string* why) {
  // Asked once: the answer cannot change within a process.
  static const std::string reason = [] {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      return std::string("no usable CUDA GPU: ") + cudaGetErrorString(status);
    }
    if (count == 0) return std::string("no CUDA GPU is visible");
    // The binary holds machine code for CMAKE_CUDA_ARCHITECTURES (and PTX for newer chips);
    // asking for a kernel's attributes loads it, and fails on a GPU the build cannot serve.
    cudaFuncAttributes attributes{};
    status = cudaFuncGetAttributes(&attributes, probe_kernel);
    if (status != cudaSuccess) {
      cudaGetLastError();
      int device = 0, major = 0, minor = 0;
      cudaGetDevice(&device);
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
      return std::string("this build's kernels cannot run on the GPU (compute capability ") +
             std::to_string(major) + "." + std::to_string(minor) +
             "): " + cudaGetErrorString(status) +
             "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + std::to_string(major * 10 + minor);
    }
    return std::string();
  }();
  if (why) *why = reason;
  return reason.empty();
}

std::unique_ptr<Device> make_cuda_device(std::shared_ptr<MemoryAccountant> accountant) {
  std::string why;
  LAYUP_CHECK(cuda_device_available(&why), "cannot use the CUDA device: ", why);
  return std::make_unique<CudaDevice>(std::move(accountant));
}

DeviceMemoryAttributes read_cuda_memory_attributes() {
  DeviceMemoryAttributes attributes = assumed_cuda_memory_attributes();
  if (!cuda_device_available(nullptr)) return attributes;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return attributes;
  }
  auto read = [device](cudaDeviceAttr attribute) {
    int value = 0;
    if (cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return value != 0;
  };
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device) == cudaSuccess)
    attributes.name = properties.name;
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) == cudaSuccess)
    attributes.pci_bus_id = bus_id;
  else
    cudaGetLastError();
  attributes.queried = true;
  attributes.integrated = read(cudaDevAttrIntegrated);
  attributes.pageable_memory_access = read(cudaDevAttrPageableMemoryAccess);
  attributes.pageable_uses_host_page_tables =
      read(cudaDevAttrPageableMemoryAccessUsesHostPageTables);
  attributes.concurrent_managed_access = read(cudaDevAttrConcurrentManagedAccess);
  attributes.managed_memory = read(cudaDevAttrManagedMemory);
  attributes.can_map_host_memory = read(cudaDevAttrCanMapHostMemory);
  if (cudaMemGetInfo(&attributes.free_bytes, &attributes.total_bytes) != cudaSuccess) {
    cudaGetLastError();
    attributes.free_bytes = attributes.total_bytes = 0;
  }
  return attributes;
}

}  // namespace layup
