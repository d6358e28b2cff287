// The CUDA device and backend record their memory in the accountant, and the memory plan matches
// what they allocate: the backend's buffers against cuda_backend_buffers at every dtype and
// --recompute level, and every accounted cell of a schedule's plan after training steps, at the
// default placement and at --place overrides (which must train bit for bit the same).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_test_support.h"
#include "core/error.h"
#include "engine/memory_planner.h"
#include "memory/memory_plan.h"
#include "model/parameter_layout.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

ModelConfig small_config() {
  return gpt2_config(3, 4, 64, 64, 300);
}

TEST(CudaMemory, TheDeviceRecordsItsBuffers) {
  LAYUP_REQUIRE_GPU();
  auto accountant = std::make_shared<MemoryAccountant>();
  std::unique_ptr<Device> device = make_cuda_device(accountant);
  EXPECT_EQ(device->memory_kind(), MemoryKind::kDevice);
  // Its buffers as cuda_device_buffers lists them (the list the memory plan sums).
  for (const PlannedAllocation& planned : cuda_device_buffers())
    EXPECT_EQ(accountant->cell(planned.side, planned.tensor_class, planned.kind).current,
              planned.bytes)
        << planned.what;
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
  const ModelConfig config = small_config();
  const int B = 3, T = 37;  // sizes that are not multiples of the alignment
  for (ComputeDtype dtype : {ComputeDtype::kFloat32, ComputeDtype::kBFloat16}) {
    for (int recompute = 0; recompute <= kMaxRecompute; ++recompute) {
      SCOPED_TRACE(std::string(compute_dtype_name(dtype)) + " recompute " +
                   std::to_string(recompute));
      auto accountant = std::make_shared<MemoryAccountant>();
      std::unique_ptr<ModelBackend> backend =
          make_cuda_backend(config, B, T, dtype, recompute, accountant);
      // Each buffer as the constructor recorded it, and as cuda_backend_buffers (which the plan
      // sums) lists it: every cell of the accountant holds exactly the list's bytes for it.
      // Before the first forward, cuDNN has no workspace yet.
      const BufferList planned = cuda_backend_buffers(config, B, T, dtype, recompute, {});
      std::map<std::tuple<MemorySide, TensorClass, MemoryKind>, size_t> cells;
      for (const PlannedAllocation& a : planned) cells[{a.side, a.tensor_class, a.kind}] += a.bytes;
      EXPECT_EQ(cells.size(), dtype == ComputeDtype::kBFloat16 ? 4u : 3u);
      for (const auto& [cell, bytes] : cells) {
        const auto [side, c, kind] = cell;
        EXPECT_EQ(accountant->cell(side, c, kind).current, bytes)
            << memory_side_name(side) << " " << tensor_class_label(c) << " "
            << memory_kind_name(kind);
      }
      size_t planned_total = 0;
      for (const PlannedAllocation& a : planned) planned_total += a.bytes;
      EXPECT_EQ(accountant->total().current, planned_total);
      backend.reset();
      EXPECT_EQ(accountant->total().current, 0u);
    }
  }
}

// Every accounted cell (side x class x kind) of the plan against the accountant's peak.
void expect_plan_matches_accountant(const MemoryPlan& plan, const MemoryAccountant& accountant) {
  for (MemorySide side : kAllMemorySides)
    for (TensorClass c : kAllTensorClasses)
      for (MemoryKind kind : kAllMemoryKinds) {
        const size_t planned = plan.accounted_bytes(side, c, kind);
        const size_t measured = accountant.cell(side, c, kind).peak;
        // cuDNN's workspace is device-side scratch the plan cannot know in advance.
        if (side == MemorySide::kDevice && c == TensorClass::kScratch)
          EXPECT_GE(measured, planned);
        else
          EXPECT_EQ(measured, planned) << memory_side_name(side) << " " << tensor_class_label(c)
                                       << " " << memory_kind_name(kind);
      }
}

struct PlacedRun {
  MemoryPlan plan;
  std::shared_ptr<MemoryAccountant> accountant;
  OptimizerTensors state;
  std::vector<float> losses;
};

// Three steps of `mode` on the GPU with the placement `place`, as the trainer builds them.
PlacedRun train_placed(const std::string& mode, const std::vector<std::string>& place, float clip,
                       ComputeDtype dtype) {
  const ModelConfig config = small_config();
  const ParameterLayout layout(config);
  const int B = 2, T = 16;
  MemoryPlanRequest request;
  request.config = config;
  request.mode = parse_in(kModeNames, mode, "mode");
  request.batch = B;
  request.seq_len = T;
  request.clip = clip;
  request.device = DeviceKind::kCuda;
  request.dtype = dtype == ComputeDtype::kBFloat16 ? Dtype::kBf16 : Dtype::kFp32;
  request.attributes = read_cuda_memory_attributes();
  request.place = parse_place_overrides(place);
  const RunMemory planned = plan_run_memory(request, 1);
  PlacedRun run{planned.plan, std::make_shared<MemoryAccountant>(), {}, {}};
  std::unique_ptr<Schedule> schedule =
      make_schedule(request.mode,
                    make_cuda_backend(config, B, T, dtype, 0, run.accountant,
                                      {run.plan.placement[TensorClass::kActivations],
                                       run.plan.placement[TensorClass::kScratch]}),
                    make_cuda_device(run.accountant), layout, planned.schedule);
  schedule->import_tensors(fresh_optimizer_tensors(layout, 7));
  std::mt19937 rng(5);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int step = 0; step < 3; ++step) {
    for (int32_t& id : inputs) id = static_cast<int32_t>(rng() % config.vocab_size);
    for (int32_t& id : targets) id = static_cast<int32_t>(rng() % config.vocab_size);
    const std::vector<TokenBatch> batches = {{inputs.data(), targets.data(), B, T}};
    UpdateSettings settings;
    settings.adamw.hyper = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    settings.adamw.t = step + 1;
    settings.clip_max_norm = clip;
    const StepStats stats = schedule->step(batches, settings);
    EXPECT_TRUE(stats.applied);
    run.losses.push_back(stats.loss);
  }
  run.state = schedule->export_tensors();
  return run;
}

TEST(CudaMemory, ThePlanMatchesTheAccountantAfterAStep) {
  LAYUP_REQUIRE_GPU();
  for (const char* mode : {"gpu", "offload", "layup"}) {
    SCOPED_TRACE(mode);
    const PlacedRun run = train_placed(mode, {}, 1.0f, ComputeDtype::kBFloat16);
    expect_plan_matches_accountant(run.plan, *run.accountant);
  }
}

// --place moves the schedules' classes between memory kinds: the accountant finds each buffer
// where the plan put it, and the training is bit for bit what the default placement gives (the
// arithmetic is the same wherever the bytes lie). Placements this GPU refuses are skipped.
TEST(CudaMemory, PlacementsAreAppliedAndTrainTheSame) {
  LAYUP_REQUIRE_GPU();
  const std::vector<std::vector<std::string>> placements = {
      {"grads=pinned"},
      {"grads=managed"},
      {"moments=pinned"},
      {"moments=managed"},
      {"master=managed"},
      {"weights=managed"},
      {"master=host"},
      {"grads=pinned", "moments=pinned", "master=pinned"},
      {"activations=pinned"},
      {"scratch=managed"},
      {"activations=managed", "scratch=pinned"}};
  for (const char* mode : {"gpu", "offload", "layup"}) {
    for (const float clip : {1.0f, 0.0f}) {
      const PlacedRun reference = train_placed(mode, {}, clip, ComputeDtype::kFloat32);
      for (const std::vector<std::string>& place : placements) {
        std::string name = std::string(mode) + (clip > 0 ? ", clip 1.0" : ", clip none");
        for (const std::string& flag : place) name += " --place " + flag;
        SCOPED_TRACE(name);
        PlacedRun run;
        try {
          run = train_placed(mode, place, clip, ComputeDtype::kFloat32);
        } catch (const Error& error) {
          const std::string what = error.what();
          // Only the plan's refusals are expected (a kind this GPU or mode cannot use).
          EXPECT_NE(what.find("is refused on"), std::string::npos) << what;
          continue;
        }
        expect_plan_matches_accountant(run.plan, *run.accountant);
        EXPECT_EQ(run.losses, reference.losses);
        EXPECT_EQ(run.state.params, reference.state.params);
        EXPECT_EQ(run.state.adam_m, reference.state.adam_m);
        EXPECT_EQ(run.state.adam_v, reference.state.adam_v);
        std::printf("[ placed ] %s: trains as the default placement, plan matches the accountant\n",
                    name.c_str());
      }
    }
  }
}

}  // namespace
}  // namespace layup
