// cuda_backend_buffers and cuda_device_buffers, counted by hand for a tiny model: the buffers the
// CUDA backend and device allocate, which the memory plan sums. Runs without a GPU.
#include "backend/cuda/cuda_backend_buffers.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

// Two layers, width 64 over 4 heads, a vocabulary of 300 padded to 384; B=2, T=32 (BT = 64), so
// that most pieces are whole multiples of the 256-byte alignment.
constexpr int kB = 2, kT = 32;
constexpr size_t BT = 64, C = 64, L = 2, Vp = 384;

ModelConfig tiny_config() {
  return gpt2_config(2, 4, 64, 64, 300);
}

size_t aligned(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// A copy: callers pass lists that live only for the call.
PlannedAllocation find(const BufferList& list, const std::string& what_begins) {
  for (const PlannedAllocation& a : list)
    if (a.what.rfind(what_begins, 0) == 0) return a;
  fail("no buffer '", what_begins, "'");
}

BufferList buffers(ComputeDtype dtype, int recompute = 0, const CudaArenaKinds& kinds = {}) {
  return cuda_backend_buffers(tiny_config(), kB, kT, dtype, recompute, kinds);
}

// The activations region: the five int32 arrays of the batch (segment_start has BT + 1, so it
// takes two 256-byte pieces), the L + 1 residual-stream inputs, each block's saved activations
// (layer-norm statistics and log-sum-exps are fp32 whatever the dtype), ln_f and its statistics,
// the logits, the losses and log-sum-exps. `t` is the activations' element size.
size_t activations_by_hand(size_t t) {
  const size_t stat = aligned(BT * 4);  // 256
  const size_t batch = 4 * aligned(BT * 4) + aligned((BT + 1) * 4);
  const size_t residual = (L + 1) * BT * C * t;
  const size_t block = BT * C * t               // ln_1
                       + 2 * stat               // its mean and rstd
                       + BT * 3 * C * t         // qkv
                       + BT * C * t             // att_out
                       + BT * 4 * 4             // att_lse [B, NH, T]
                       + BT * C * t             // residual_mid
                       + BT * C * t + 2 * stat  // ln_2, its mean and rstd
                       + 2 * BT * 4 * C * t;    // fc and fc_gelu
  const size_t head = BT * C * t + 2 * stat + BT * Vp * t + 2 * stat;
  return batch + residual + L * block + head;
}

TEST(CudaBackendBuffers, Fp32CountedByHand) {
  const BufferList list = buffers(ComputeDtype::kFloat32);
  // No compute copy of the weights: the kernels read the fp32 master.
  for (const PlannedAllocation& a : list) EXPECT_NE(a.tensor_class, TensorClass::kWeights);
  EXPECT_EQ(list.size(), 4u);
  EXPECT_EQ(find(list, "activations saved").bytes, activations_by_hand(4));
  EXPECT_EQ(activations_by_hand(4), 662016u);
  // branch_out, d_residual, d_ln, d_att_out (BTC each), d_qkv (3 BTC), d_fc_gelu and d_fc (4 BTC
  // each; fp32 runs GELU as an op of its own), and the ops' scratch: the bias gradient's column
  // sums over [64, 256] in one chunk of rows, the most any backward op asks for here.
  EXPECT_EQ(find(list, "activation gradients").bytes,
            4 * (4 * BT * C + 3 * BT * C + 8 * BT * C) + aligned(256 * 4));
}

TEST(CudaBackendBuffers, Bf16CountedByHand) {
  const BufferList list = buffers(ComputeDtype::kBFloat16);
  EXPECT_EQ(list.size(), 5u);
  // The compute copy: two bytes a parameter, every span starting 256-byte aligned.
  const ParameterLayout layout(tiny_config());
  size_t weights = 0;
  for (const Span& span : layout.spans()) weights = aligned(weights) + span.count * 2;
  const PlannedAllocation& copy = find(list, "bf16 compute copy");
  EXPECT_EQ(copy.bytes, weights);
  EXPECT_EQ(copy.side, MemorySide::kDevice);
  EXPECT_EQ(copy.tensor_class, TensorClass::kWeights);
  EXPECT_EQ(copy.kind, MemoryKind::kDevice);
  EXPECT_EQ(find(list, "activations saved").bytes, activations_by_hand(2));
  // The MLP's GELU rides in the matmul epilogues (4C is a multiple of 8): no d_fc_gelu.
  EXPECT_EQ(find(list, "activation gradients").bytes,
            2 * (4 * BT * C + 3 * BT * C + 4 * BT * C) + aligned(256 * 4));
}

TEST(CudaBackendBuffers, RecomputeShrinksTheActivationsAsDocumented) {
  for (ComputeDtype dtype : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16}) {
    const size_t t = dtype == ComputeDtype::kFloat32 ? 4 : 2;
    const size_t level0 = find(buffers(dtype, 0), "activations saved").bytes;
    const size_t level1 = find(buffers(dtype, 1), "activations saved").bytes;
    const size_t level2 = find(buffers(dtype, 2), "activations saved").bytes;
    const size_t level3 = find(buffers(dtype, 3), "activations saved").bytes;
    // 1: one shared GELU output instead of L; 2: also one shared layer-norm output instead of 2L.
    EXPECT_EQ(level0 - level1, (L - 1) * BT * 4 * C * t);
    EXPECT_EQ(level1 - level2, (2 * L - 1) * BT * C * t);
    // 3: one block's set for all L (the residual stream's inputs stay): qkv, the attention's
    // output, residual_mid, the pre-GELU MLP, four layer-norm statistics and the log-sum-exps.
    const size_t block_set = aligned(3 * BT * C * t) + 2 * aligned(BT * C * t) +
                             aligned(4 * BT * C * t) + 4 * aligned(BT * 4) +
                             aligned(BT * 4 * 4);  // att_lse: [B, NH = 4, T]
    EXPECT_EQ(level2 - level3, (L - 1) * block_set);
    // The scratch and the weights do not change.
    EXPECT_EQ(find(buffers(dtype, 0), "activation gradients").bytes,
              find(buffers(dtype, 2), "activation gradients").bytes);
  }
  EXPECT_THROW(buffers(ComputeDtype::kFloat32, kMaxRecompute + 1), Error);
}

TEST(CudaBackendBuffers, KindsFollowThePlacement) {
  const BufferList list =
      buffers(ComputeDtype::kBFloat16, 0, {MemoryKind::kPinnedMapped, MemoryKind::kManaged});
  EXPECT_EQ(find(list, "activations saved").kind, MemoryKind::kPinnedMapped);
  EXPECT_EQ(find(list, "activation gradients").kind, MemoryKind::kManaged);
  // The compute copy and cuBLASLt's workspace stay in device memory whatever the placement.
  EXPECT_EQ(find(list, "bf16 compute copy").kind, MemoryKind::kDevice);
  const PlannedAllocation& workspace = find(list, "cuBLASLt workspace");
  EXPECT_EQ(workspace.kind, MemoryKind::kDevice);
  EXPECT_EQ(workspace.tensor_class, TensorClass::kScratch);
  EXPECT_EQ(workspace.bytes, kCublasLtWorkspaceBytes);
  // The regions are device-side memory wherever they are placed; the staging is the host's.
  for (const PlannedAllocation& a : list) {
    EXPECT_TRUE(a.accounted) << a.what;
    EXPECT_FALSE(a.transient) << a.what;
    if (a.what.rfind("pinned staging", 0) != 0) {
      EXPECT_EQ(a.side, MemorySide::kDevice) << a.what;
    }
  }
}

TEST(CudaBackendBuffers, PinnedStaging) {
  const PlannedAllocation staging = find(buffers(ComputeDtype::kFloat32), "pinned staging");
  EXPECT_EQ(staging.side, MemorySide::kHost);
  EXPECT_EQ(staging.tensor_class, TensorClass::kScratch);
  EXPECT_EQ(staging.kind, MemoryKind::kPinnedMapped);
  // Five int32 arrays of BT (one of them BT + 1) up, BT float losses back.
  EXPECT_EQ(staging.bytes, (5 * BT + 1) * 4 + BT * 4);
  EXPECT_EQ(pinned_staging_layout(kB, kT).bytes(), staging.bytes);
}

TEST(CudaBackendBuffers, TheDevicesPartialSums) {
  const BufferList list = cuda_device_buffers();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].side, MemorySide::kDevice);
  EXPECT_EQ(list[0].tensor_class, TensorClass::kScratch);
  EXPECT_EQ(list[0].kind, MemoryKind::kDevice);
  EXPECT_EQ(list[0].bytes, kCudaDeviceNormPartials * sizeof(double));
  EXPECT_TRUE(list[0].accounted);
}

}  // namespace
}  // namespace layup
