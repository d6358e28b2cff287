// The CUDA backend's and device's buffer lists; see cuda_backend_buffers.h. The regions are
// measured by the backend's own carve() (cuda_arena.h), run over a 2-byte stand-in for bf16.
#include "backend/cuda/cuda_backend_buffers.h"

#include <cstdint>

#include "backend/cuda/cuda_arena.h"
#include "core/error.h"

namespace layup {
namespace {

// The regions' bytes as carve() measures them with activations of type T.
template <class T>
std::array<size_t, kArenaRegions> measure_regions(const ModelConfig& config, int max_batch,
                                                  int max_seq_len, int recompute,
                                                  const std::vector<char>& elsewhere) {
  CudaArena<T> arena;
  Carver measure;
  arena.carve(measure, cuda_arena_shape<T>(config, max_batch, max_seq_len, recompute, elsewhere));
  return {measure.used(ArenaRegion::kWeights), measure.used(ArenaRegion::kActivations),
          measure.used(ArenaRegion::kScratch)};
}

}  // namespace

const char* compute_dtype_name(ComputeDtype dtype) {
  return dtype == ComputeDtype::kFloat32 ? "fp32" : "bf16";
}

PinnedStagingLayout pinned_staging_layout(int max_batch, int max_seq_len) {
  const size_t BT = static_cast<size_t>(max_batch) * max_seq_len;
  return {5 * BT + 1, BT};
}

BufferList CudaBackendBuffers::list() const {
  BufferList list;
  for (const PlannedAllocation& region : regions)
    if (region.bytes > 0 || region.tensor_class != TensorClass::kWeights) list.push_back(region);
  list.push_back(cublaslt_workspace);
  list.push_back(pinned_staging);
  return list;
}

CudaBackendBuffers describe_cuda_backend_buffers(const ModelConfig& config, int max_batch,
                                                 int max_seq_len, ComputeDtype dtype, int recompute,
                                                 const CudaArenaKinds& kinds) {
  LAYUP_CHECK(recompute >= 0 && recompute <= kMaxRecompute, "--recompute takes 0, 1, 2 or 3, not ",
              recompute);
  const std::array<size_t, kArenaRegions> bytes =
      dtype == ComputeDtype::kFloat32
          ? measure_regions<float>(config, max_batch, max_seq_len, recompute, {})
          : measure_regions<uint16_t>(config, max_batch, max_seq_len, recompute,
                                      kinds.compute_copy_elsewhere);
  constexpr MemorySide dev = MemorySide::kDevice;
  CudaBackendBuffers buffers;
  // The compute copy is derived from the fp32 weights wherever those are placed, so it is always
  // in device memory.
  buffers.regions[0] = {dev, TensorClass::kWeights, MemoryKind::kDevice, bytes[0],
                        "bf16 compute copy of the weights (the backend's weights region)"};
  buffers.regions[1] = {
      dev, TensorClass::kActivations, kinds.activations, bytes[1],
      "activations saved for the backward, token ids, logits (the backend's activations)"};
  buffers.regions[2] = {dev, TensorClass::kScratch, kinds.scratch, bytes[2],
                        "activation gradients and the ops' scratch (the backend's scratch)"};
  // The library's workspace stays in device memory whatever --place scratch says (that places the
  // backward's activation gradients above).
  buffers.cublaslt_workspace = {dev, TensorClass::kScratch, MemoryKind::kDevice,
                                kCublasLtWorkspaceBytes, "cuBLASLt workspace"};
  buffers.pinned_staging = {MemorySide::kHost, TensorClass::kScratch, MemoryKind::kPinnedMapped,
                            pinned_staging_layout(max_batch, max_seq_len).bytes(),
                            "pinned staging of token ids, targets and losses"};
  return buffers;
}

BufferList cuda_backend_buffers(const ModelConfig& config, int max_batch, int max_seq_len,
                                ComputeDtype dtype, int recompute, const CudaArenaKinds& kinds) {
  return describe_cuda_backend_buffers(config, max_batch, max_seq_len, dtype, recompute, kinds)
      .list();
}

BufferList cuda_collectives_buffers() {
  // 64 MiB: long enough for NVLink's bandwidth, small beside a model.
  return {{MemorySide::kDevice, TensorClass::kScratch, MemoryKind::kDevice,
           kNcclRoundFloats * sizeof(float),
           "the ranks' pieces of the gradient being summed, one round (NCCL)"}};
}

BufferList cuda_device_buffers() {
  return {{MemorySide::kDevice, TensorClass::kScratch, MemoryKind::kDevice,
           kCudaDeviceNormPartials * sizeof(double), "gradient-norm partial sums"}};
}

}  // namespace layup
