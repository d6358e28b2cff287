// The CUDA device and backend record their memory in the accountant, and the memory plan matches
// what they allocate: the activation arena against carve() at every dtype and --recompute level,
// and every accounted cell of a schedule's plan after a training step.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_test_support.h"
#include "memory/backend_memory.h"
#include "memory/memory_plan.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

Gpt2Config small_config() {
  return gpt2_config(3, 4, 64, 64, 300);
}

TEST(CudaMemory, TheDeviceRecordsItsBuffers) {
  LAYUP_REQUIRE_GPU();
  auto accountant = std::make_shared<MemoryAccountant>();
  std::unique_ptr<Device> device = make_cuda_device(accountant);
  EXPECT_EQ(device->memory_kind(), MemoryKind::kDevice);
  EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kScratch).current,
            kCudaDeviceScratchBytes);
  {
    DeviceBuffer grads = device->allocate(1000, TensorClass::kWeightGrads);
    EXPECT_EQ(accountant->cell(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice)
                  .current,
              4000u);
  }
  EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kWeightGrads).current, 0u);
  EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kWeightGrads).peak, 4000u);
}

TEST(CudaMemory, TheBackendsArenaIsWhatThePlanSays) {
  LAYUP_REQUIRE_GPU();
  const Gpt2Config config = small_config();
  const int B = 3, T = 37;  // sizes that are not multiples of the alignment
  for (ComputeDtype dtype : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16}) {
    for (int recompute = 0; recompute <= kMaxRecompute; ++recompute) {
      SCOPED_TRACE(std::string(compute_dtype_name(dtype)) + " recompute " +
                   std::to_string(recompute));
      auto accountant = std::make_shared<MemoryAccountant>();
      std::unique_ptr<ModelBackend> backend =
          make_cuda_backend(config, B, T, dtype, recompute, accountant);
      const BackendBytes planned =
          cuda_arena_bytes(config, B, T, dtype == ComputeDtype::kBFloat16, recompute);
      // The measured arena is the sum of the three rows; the split is the plan's.
      EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kWeights).current,
                planned.weights);
      EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kActivations).current,
                planned.activations);
      // Before the first forward, cuDNN has no workspace yet.
      EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kScratch).current,
                planned.scratch + kCublasLtWorkspaceBytes);
      EXPECT_EQ(
          accountant->cell(MemorySide::kHost, TensorClass::kScratch, MemoryKind::kPinnedMapped)
              .current,
          cuda_pinned_staging_bytes(B, T));
      backend.reset();
      EXPECT_EQ(accountant->total().current, 0u);
    }
  }
}

TEST(CudaMemory, ThePlanMatchesTheAccountantAfterAStep) {
  LAYUP_REQUIRE_GPU();
  const Gpt2Config config = small_config();
  const ParameterLayout layout(config);
  const int B = 2, T = 16;
  for (const char* mode_name : {"gpu", "offload", "layup"}) {
    const std::string mode = mode_name;
    SCOPED_TRACE(mode);
    MemoryPlanRequest request;
    request.config = config;
    request.mode = mode;
    request.batch = B;
    request.seq_len = T;
    request.device = "cuda";
    request.dtype = "bf16";
    request.attributes = cuda_memory_attributes();
    const MemoryPlan plan = plan_memory(request);

    auto accountant = std::make_shared<MemoryAccountant>();
    std::unique_ptr<Schedule> schedule =
        make_schedule(mode, make_cuda_backend(config, B, T, ComputeDtype::kBFloat16, 0, accountant),
                      make_cuda_device(accountant), layout, schedule_options(plan, 1));
    schedule->import_tensors(fresh_optimizer_tensors(layout, 7));
    std::mt19937 rng(5);
    std::vector<int32_t> tokens(B * T);
    for (int32_t& id : tokens) id = static_cast<int32_t>(rng() % config.vocab_size);
    const std::vector<TokenBatch> batches = {{tokens.data(), tokens.data(), B, T}};
    UpdateSettings settings;
    settings.adamw.hyper = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    settings.adamw.t = 1;
    ASSERT_TRUE(schedule->step(batches, settings).applied);

    for (MemorySide side : kAllMemorySides)
      for (TensorClass c : kAllTensorClasses)
        for (MemoryKind kind : kAllMemoryKinds) {
          size_t planned = 0;
          for (const PlannedAllocation& a : plan.allocations)
            if (a.accounted && a.side == side && a.tensor_class == c && a.kind == kind)
              planned += a.bytes;
          const size_t measured = accountant->cell(side, c, kind).peak;
          // cuDNN's workspace is device-side scratch the plan cannot know in advance.
          if (side == MemorySide::kDevice && c == TensorClass::kScratch)
            EXPECT_GE(measured, planned);
          else
            EXPECT_EQ(measured, planned) << memory_side_name(side) << " " << tensor_class_label(c)
                                         << " " << memory_kind_name(kind);
        }
  }
}

}  // namespace
}  // namespace layup
