// The CPU backend's buffer list: its sizes against a hand count, the backend's records in the
// accountant against the list while it lives, and clear errors for shapes that cannot be allocated.
#include "backend/cpu/cpu_backend_buffers.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {
namespace {

// Two layers, two heads, width 16, a 61-token vocabulary padded to 128.
ModelConfig tiny_config() {
  return gpt2_config(2, 2, 16, 8, 61);
}

TEST(CpuBackendBuffers, ListsTheActivationsAndTheScratchAsHostMemory) {
  const BufferList buffers = cpu_backend_buffers(tiny_config(), 2, 8);
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].tensor_class, TensorClass::kActivations);
  EXPECT_EQ(buffers[1].tensor_class, TensorClass::kScratch);
  for (const PlannedAllocation& buffer : buffers) {
    EXPECT_EQ(buffer.side, MemorySide::kDevice);
    EXPECT_EQ(buffer.kind, MemoryKind::kHost);
    EXPECT_TRUE(buffer.accounted);
    EXPECT_FALSE(buffer.transient);
    EXPECT_NE(buffer.what.find("the CPU backend's"), std::string::npos) << buffer.what;
  }
}

// B=2, T=8: BT = 16 positions, BTC = 256 floats; every piece is a multiple of 64 bytes, so there is
// no padding and the sizes are the plain sums.
TEST(CpuBackendBuffers, SizesEqualAHandCountWithoutPadding) {
  const BufferList buffers = cpu_backend_buffers(tiny_config(), 2, 8);
  // Token ids and targets: 2 x 16 int32 = 128 B. Floats: residual 3 x 256 = 768; per block
  // ln_1, att_out, residual_mid, ln_2 4 x 256, qkv 768, att 2 x 2 x 8 x 8 = 256, fc and fc_gelu
  // 2 x 1024, four statistics 4 x 16: 4160, two blocks 8320; ln_f 256 and its statistics 32;
  // logits 16 x 128 = 2048; losses and logsumexp 32. 11456 floats = 45824 B.
  EXPECT_EQ(buffers[0].bytes, 128u + 45824u);
  // branch_out, d_residual, d_ln, d_att_out 4 x 256, d_qkv 768, d_fc_gelu and d_fc 2 x 1024, and a
  // chunk of dlogits of all 16 rows x 128: 5888 floats.
  EXPECT_EQ(buffers[1].bytes, 5888u * 4);
}

// B=1, T=3: BT = 3, so every [BT] piece (12 B) is padded to 64 B, except the region's last.
TEST(CpuBackendBuffers, SizesEqualAHandCountWithPadding) {
  const BufferList buffers = cpu_backend_buffers(tiny_config(), 1, 3);
  // Token ids and targets 2 x 64; residual 3 x 192; per block ln_1, att_out, residual_mid, ln_2
  // 4 x 192, qkv 576, att 18 floats = 72 -> 128, fc and fc_gelu 2 x 768, four statistics 4 x 64:
  // 3264, two blocks 6528; ln_f 192 and its statistics 2 x 64; logits 3 x 128 x 4 = 1536; losses
  // 64; logsumexp 12 (the last piece, unpadded).
  EXPECT_EQ(buffers[0].bytes, 128u + 576 + 6528 + 192 + 128 + 1536 + 64 + 12);
  // 4 x 192, d_qkv 576, 2 x 768, dlogits 3 x 128 x 4 = 1536.
  EXPECT_EQ(buffers[1].bytes, 768u + 576 + 1536 + 1536);
}

TEST(CpuBackendBuffers, CarvedPiecesAreAlignedAndInsideTheirRegions) {
  const ModelConfig config = tiny_config();
  const int B = 1, T = 3;
  CpuBackendArena measured;
  const CpuRegionBytes bytes = carve_cpu_backend(config, B, T, nullptr, nullptr, measured);
  EXPECT_EQ(measured.residual.size(), 3u);
  EXPECT_EQ(measured.blocks.size(), 2u);
  EXPECT_EQ(measured.logits, nullptr);

  auto activations = std::make_unique<char[]>(bytes.activations + kCpuArenaAlignBytes);
  auto scratch = std::make_unique<char[]>(bytes.scratch + kCpuArenaAlignBytes);
  auto aligned = [](char* base) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(base);
    return base + (kCpuArenaAlignBytes - at % kCpuArenaAlignBytes) % kCpuArenaAlignBytes;
  };
  char* a = aligned(activations.get());
  char* s = aligned(scratch.get());
  CpuBackendArena arena;
  const CpuRegionBytes placed = carve_cpu_backend(config, B, T, a, s, arena);
  EXPECT_EQ(placed.activations, bytes.activations);
  EXPECT_EQ(placed.scratch, bytes.scratch);
  auto inside = [](const void* piece, const char* base, size_t region_bytes) {
    const char* p = static_cast<const char*>(piece);
    return p >= base && p < base + region_bytes &&
           reinterpret_cast<uintptr_t>(p) % kCpuArenaAlignBytes == 0;
  };
  EXPECT_TRUE(inside(arena.inputs, a, bytes.activations));
  EXPECT_TRUE(inside(arena.targets, a, bytes.activations));
  for (const float* residual : arena.residual) EXPECT_TRUE(inside(residual, a, bytes.activations));
  for (const CpuBlockActivations& block : arena.blocks)
    for (const float* piece : {block.ln_1, block.ln_1_mean, block.ln_1_rstd, block.qkv, block.att,
                               block.att_out, block.residual_mid, block.ln_2, block.ln_2_mean,
                               block.ln_2_rstd, block.fc, block.fc_gelu})
      EXPECT_TRUE(inside(piece, a, bytes.activations));
  for (const float* piece :
       {arena.ln_f, arena.ln_f_mean, arena.ln_f_rstd, arena.logits, arena.losses, arena.logsumexp})
    EXPECT_TRUE(inside(piece, a, bytes.activations));
  for (const float* piece : {arena.branch_out, arena.d_residual, arena.d_ln, arena.d_att_out,
                             arena.d_qkv, arena.d_fc_gelu, arena.d_fc, arena.d_logits_chunk})
    EXPECT_TRUE(inside(piece, s, bytes.scratch));
  // The region ends where its last piece does.
  EXPECT_EQ(reinterpret_cast<const char*>(arena.logsumexp + B * T), a + bytes.activations);
  EXPECT_EQ(arena.logits_chunk_rows, B * T);
  EXPECT_EQ(
      reinterpret_cast<const char*>(arena.d_logits_chunk + size_t{3} * config.padded_vocab_size),
      s + bytes.scratch);
}

TEST(CpuBackendBuffers, TheAccountantHoldsTheListWhileTheBackendLives) {
  const ModelConfig config = tiny_config();
  const BufferList buffers = cpu_backend_buffers(config, 3, 7);
  auto accountant = std::make_shared<MemoryAccountant>();
  size_t total = 0;
  {
    const std::unique_ptr<ModelBackend> backend = make_cpu_backend(config, 3, 7, accountant);
    for (const PlannedAllocation& buffer : buffers) {
      EXPECT_EQ(accountant->cell(buffer.side, buffer.tensor_class, buffer.kind).current,
                buffer.bytes)
          << buffer.what;
      total += buffer.bytes;
    }
    EXPECT_EQ(accountant->total().current, total);
    EXPECT_EQ(accountant->cells().size(), buffers.size());
  }
  EXPECT_EQ(accountant->total().current, 0u);
  EXPECT_EQ(accountant->total().peak, total);
}

TEST(CpuBackendBuffers, RefusesShapesTheBackendRefuses) {
  const ModelConfig config = tiny_config();
  EXPECT_THROW(cpu_backend_buffers(config, 0, 4), Error);
  EXPECT_THROW(cpu_backend_buffers(config, 2, 0), Error);
  EXPECT_THROW(cpu_backend_buffers(config, 2, config.n_positions + 1), Error);
}

TEST(CpuBackendBuffers, SizesBeyond64BitsAreAnErrorNotAWrap) {
  try {
    cpu_backend_buffers(gpt2_config(1, 1, 8, 1 << 30, 61), INT_MAX, 1 << 30);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("overflow"), std::string::npos) << error.what();
  }
}

#if defined(__SANITIZE_ADDRESS__)
#define LAYUP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LAYUP_ASAN 1
#endif
#endif

TEST(CpuBackendBuffers, AnAllocationThatFailsIsAClearError) {
#ifdef LAYUP_ASAN
  GTEST_SKIP() << "AddressSanitizer reports a huge allocation instead of returning null";
#else
  // About 14 PB of activations (the logits alone): beyond the 48-bit address space a process
  // maps by default, so the allocation fails even where the kernel overcommits without limit.
  const ModelConfig config = gpt2_config(1, 1, 64, 1024, 50257);
  auto accountant = std::make_shared<MemoryAccountant>();
  try {
    make_cpu_backend(config, 1 << 26, 1024, accountant);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("out of host memory"), std::string::npos) << message;
    EXPECT_NE(message.find("the CPU backend's activations"), std::string::npos) << message;
  }
  EXPECT_EQ(accountant->total().current, 0u);
#endif
}

}  // namespace
}  // namespace layup
