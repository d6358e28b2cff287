// The memory plan against reality and against the numbers:
//  - on the CPU backend, every cell the accountant measures after building each schedule and
//    running a step equals the plan's (every mode, with and without accumulation), and the plan
//    and the step-time model read the schedule's step plan (every placement);
//  - gpt2-large at B=8, T=1024: `layup` keeps two blocks' weight gradients plus the embeddings'
//    and the final norm's on the device, 86.4% less than `gpu` mode;
//  - a 16 GiB budget (a unified-memory board, emulated on the CPU backend): what fits and what is
//    refused, with the message;
//  - placement checks and size parsing.
#include "engine/memory_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/calibration.h"
#include "engine/step_time_model.h"
#include "io/streamed_file_writer.h"
#include "model/parameter_layout.h"
#include "schedule/disk_tier.h"
#include "schedule/optimizer_shards.h"
#include "schedule/packed_moments.h"
#include "schedule/random_step.h"
#include "schedule/schedule.h"
#include "schedule/schedule_plan.h"
#include "schedule/weight_ring.h"
#include "train/benchmark.h"

namespace layup {
namespace {

ModelConfig tiny_config() {
  return gpt2_config(3, 2, 32, 16, 61);
}

MemoryPlanRequest cpu_request(const ModelConfig& config, const std::string& mode, int batch,
                              int seq_len, int grad_accum = 1) {
  MemoryPlanRequest request;
  request.config = config;
  request.model_name = "test";
  request.mode = parse_in(kModeNames, mode, "mode");
  request.batch = batch;
  request.seq_len = seq_len;
  request.grad_accum = grad_accum;
  return request;
}

// The message of the layup::Error `run` throws, or "" when it throws none.
std::string error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// `request` planned for a discrete GPU (its attributes assumed, not read), bf16.
MemoryPlanRequest on_a_discrete_gpu(MemoryPlanRequest request) {
  request.device = DeviceKind::kCuda;
  request.dtype = Dtype::kBf16;
  request.attributes = assumed_cuda_memory_attributes();
  request.attributes.integrated = false;
  return request;
}

// The schedule options a plan was made with.
ScheduleOptions schedule_of(const MemoryPlan& plan, int cpu_workers = 0) {
  return plan_run_memory(plan.request, cpu_workers).schedule;
}

// Llama 3 8B as issue 43 trains it on a 24 GiB board: layup on a discrete GPU, B x 2048 x 8
// micro-batches layer-major, --recompute 3, deferred clipping, 8-bit moments.
MemoryPlanRequest llama_3_8b_on_a_24_gib_board(int batch) {
  MemoryPlanRequest llama =
      on_a_discrete_gpu(cpu_request(named_config("llama-3-8b"), "layup", batch, 2048, 8));
  llama.recompute = 3;
  llama.accumulation = Accumulation::kLayerMajor;
  llama.layup_clip = LayupClip::kDeferred;
  llama.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  return llama;
}

std::string refusal(const MemoryPlan& plan, const MemoryBudgets& budgets) {
  return error_of([&] { check_run_budget(plan, budgets); });
}

// The memory plan lists the step plan's buffers first, as they are, and the step-time model times
// that plan's tasks.
void expect_one_step_plan(const RunMemory& run) {
  const BufferList& buffers = run.step.buffers;
  ASSERT_GE(run.plan.allocations.size(), buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ(run.plan.allocations[i].what, buffers[i].what);
    EXPECT_EQ(run.plan.allocations[i].bytes, buffers[i].bytes) << buffers[i].what;
    EXPECT_EQ(run.plan.allocations[i].kind, buffers[i].kind) << buffers[i].what;
  }
  MachineRates rates;
  rates.gpu_flops = rates.gpu_adamw_params_per_s = rates.cpu_adamw_params_per_s = 1e9;
  rates.host_add_floats_per_s = rates.d2h_bytes_per_s = rates.h2d_bytes_per_s = 1e9;
  rates.disk_read_bytes_per_s = rates.disk_write_bytes_per_s = 1e9;
  const StepTimePrediction predicted =
      predict_step_time(step_time_request(run.plan.request, run.step), rates);
  EXPECT_EQ(predicted.tasks, run.step.tasks.size());
  EXPECT_GT(predicted.step_s, 0.0);
}

TEST(MemoryPlan, MatchesWhatTheAccountantMeasuresOnTheCpuBackend) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  constexpr int kBatch = 2, kSeqLen = 8;
  for (const char* mode_name : {"gpu", "offload", "layup"}) {
    const std::string mode = mode_name;
    for (int grad_accum : {1, 2})
      for (float clip : {1.0f, 0.0f})
        for (const Accumulation accumulation :
             {Accumulation::kMicroBatchMajor, Accumulation::kLayerMajor}) {
          if (accumulation == Accumulation::kLayerMajor && (grad_accum == 1 || mode == "gpu"))
            continue;
          SCOPED_TRACE(mode + " x" + std::to_string(grad_accum) + " clip " + std::to_string(clip) +
                       " " + name_of(accumulation));
          MemoryPlanRequest request = cpu_request(config, mode, kBatch, kSeqLen, grad_accum);
          request.clip = clip;
          request.accumulation = accumulation;
          const RunMemory run = plan_run_memory(request, 1);
          // Layer-major layup keeps a whole host gradient only to clip (the head's sum apart).
          if (mode == "layup" && accumulation == Accumulation::kLayerMajor) {
            EXPECT_EQ(run.schedule.host_gradient, clip > 0.0f);
          }
          const MemoryPlan& plan = run.plan;
          auto accountant = std::make_shared<MemoryAccountant>();
          std::unique_ptr<Schedule> schedule = make_schedule(
              plan.request.mode, make_cpu_backend(config, kBatch, kSeqLen, accountant),
              make_cpu_device(accountant), layout, run.schedule);
          schedule->import_tensors(fresh_optimizer_tensors(layout, 7));

          // One step, so that what is allocated at the first step (gpu mode's accumulator) is too.
          ASSERT_TRUE(random_step(*schedule, config, kBatch, kSeqLen, grad_accum, clip).applied);

          size_t accounted = 0;
          for (MemorySide side : kAllMemorySides)
            for (TensorClass c : kAllTensorClasses)
              for (MemoryKind kind : kAllMemoryKinds) {
                const size_t planned = plan.accounted_bytes(side, c, kind);
                const MemoryUsage measured = accountant->cell(side, c, kind);
                EXPECT_EQ(measured.peak, planned)
                    << memory_side_name(side) << " " << tensor_class_label(c) << " "
                    << memory_kind_name(kind);
                EXPECT_EQ(measured.current, planned);
                accounted += planned;
              }
          // Everything but the process's own allowance and the transient copies is measured: the
          // backend's activations and scratch too.
          EXPECT_GT(plan.accounted_bytes(MemorySide::kDevice, TensorClass::kActivations,
                                         MemoryKind::kHost),
                    0u);
          for (const PlannedAllocation& a : plan.allocations) {
            if (!a.accounted) {
              EXPECT_TRUE(a.transient || a.tensor_class == TensorClass::kScratch) << a.what;
            }
          }
          EXPECT_EQ(accountant->total().peak, accounted);
          const std::string report = format_memory_report(plan, *accountant);
          EXPECT_NE(report.find("every accounted cell matches the plan exactly"), std::string::npos)
              << report;
          // What the accountant cannot see is labelled as planned.
          EXPECT_NE(report.find("planned only, NOT measured"), std::string::npos) << report;
          expect_one_step_plan(run);
        }
  }
}

// Layer-major accumulation on CUDA computes each block's forward again from its input: it needs
// --recompute 3, and says so; its plan lists the stores on the host and the forward's hidden
// states on the device. gpu mode sums where the gradients lie and ignores it, with a note.
TEST(MemoryPlan, LayerMajorNeedsRecomputeThreeOnCuda) {
  const ModelConfig config = gpt2_config(6, 2, 64, 64);
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 2, 64, 4));
  request.accumulation = Accumulation::kLayerMajor;
  EXPECT_NE(error_of([&] { plan_run_memory(request); }).find("--recompute 3"), std::string::npos)
      << error_of([&] { plan_run_memory(request); });
  request.recompute = 3;
  const RunMemory run = plan_run_memory(request);
  EXPECT_EQ(run.step.accumulation, Accumulation::kLayerMajor);
  EXPECT_GT(run.plan.bytes(MemorySide::kHost, TensorClass::kActivations), 0u) << "the stores";
  // The layer-major forward's hidden states: one a micro-batch, B x T x C in bf16, device memory.
  int hidden_states = 0;
  for (const PlannedAllocation& a : run.plan.allocations)
    if (a.what.find("hidden state") != std::string::npos) {
      ++hidden_states;
      EXPECT_EQ(a.side, MemorySide::kDevice);
      EXPECT_EQ(a.tensor_class, TensorClass::kActivations);
      EXPECT_EQ(a.kind, MemoryKind::kDevice);
      EXPECT_EQ(a.bytes, size_t{2} * 64 * 64 * 2);
    }
  EXPECT_EQ(hidden_states, 4);
  request.mode = Mode::kGpu;
  request.recompute = 0;
  const RunMemory gpu = plan_run_memory(request);
  EXPECT_EQ(gpu.step.accumulation, Accumulation::kMicroBatchMajor);
  bool noted = false;
  for (const std::string& note : gpu.plan.notes)
    noted = noted || note.find("changes nothing there") != std::string::npos;
  EXPECT_TRUE(noted);
}

// --accumulate auto (the default) takes layer-major on a discrete GPU where the blocks' gradients
// outweigh the activations it moves (wide blocks, few rows), else micro-batch-major: with narrow
// blocks and many rows, on the CPU backend, without --recompute 3, with several ranks, and where
// every block is updated on the device.
TEST(MemoryPlan, AutoAccumulationTakesLayerMajorWhereItMovesFewerBytes) {
  const ModelConfig config = gpt2_config(4, 4, 512, 256);
  const auto accumulation = [](MemoryPlanRequest request) {
    return plan_run_memory(request).step.accumulation;
  };
  MemoryPlanRequest wide = on_a_discrete_gpu(cpu_request(config, "layup", 1, 32, 4));
  wide.recompute = 3;
  ASSERT_EQ(wide.accumulation, Accumulation::kAuto) << "the default";
  EXPECT_EQ(accumulation(wide), Accumulation::kLayerMajor);
  MemoryPlanRequest offload = wide;
  offload.mode = Mode::kOffload;
  EXPECT_EQ(accumulation(offload), Accumulation::kLayerMajor);
  MemoryPlanRequest many_rows = wide;
  many_rows.batch = 64;
  many_rows.seq_len = 256;
  EXPECT_EQ(accumulation(many_rows), Accumulation::kMicroBatchMajor);
  MemoryPlanRequest no_recompute = wide;
  no_recompute.recompute = 0;
  EXPECT_EQ(accumulation(no_recompute), Accumulation::kMicroBatchMajor) << "and no refusal";
  MemoryPlanRequest ranks = wide;
  ranks.ranks = 2;
  EXPECT_EQ(accumulation(ranks), Accumulation::kMicroBatchMajor);
  MemoryPlanRequest all_on_device = wide;
  all_on_device.optimizer_placement = OptimizerPlacement::parse("device:4");
  EXPECT_EQ(accumulation(all_on_device), Accumulation::kMicroBatchMajor);
  MemoryPlanRequest cpu = cpu_request(config, "layup", 1, 32, 4);
  EXPECT_EQ(accumulation(cpu), Accumulation::kMicroBatchMajor);
  // An explicit order is kept either way.
  cpu.accumulation = Accumulation::kLayerMajor;
  EXPECT_EQ(accumulation(cpu), Accumulation::kLayerMajor);
  many_rows.accumulation = Accumulation::kLayerMajor;
  EXPECT_EQ(accumulation(many_rows), Accumulation::kLayerMajor);
}

// Every mode and placement on a discrete GPU (planned only): the step plan's sites are the
// schedule's, and the memory plan and the step-time model read that one plan.
TEST(MemoryPlan, ThePlannerAndTheTimeModelReadTheSchedulesStepPlan) {
  const ModelConfig config = gpt2_config(6, 2, 64, 64);
  for (const char* mode : {"gpu", "offload", "layup"})
    for (const char* placement : {"host", "device:2", "disk:2", "device:1,disk:3"})
      for (const LayupHead head : {LayupHead::kDevice, LayupHead::kHost}) {
        if (std::string(mode) != "layup" && std::string(placement) != "host") continue;
        SCOPED_TRACE(std::string(mode) + " " + placement);
        MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, mode, 2, 64, 2));
        request.layup_head = head;
        request.offload_dir = "/offload";
        if (std::string(mode) == "layup")
          request.optimizer_placement = OptimizerPlacement::parse(placement);
        const RunMemory run = plan_run_memory(request);
        const std::vector<UpdateSite>& sites = run.schedule.update_sites;
        for (size_t i = 0; i < sites.size(); ++i)
          EXPECT_EQ(run.step.spans[i].site, sites[i]) << "span " << i;
        expect_one_step_plan(run);
      }
}

TEST(MemoryPlan, BenchReportsThePlanAndTheMeasuredPeaksAndRefusesOverBudget) {
  BenchmarkOptions options;
  options.model_name = "tiny";
  options.model = tiny_config();
  options.batch = 2;
  options.seq_len = 8;
  options.warmup_steps = 0;
  options.steps = 1;
  options.device = DeviceKind::kCpu;
  options.dtype = Dtype::kFp32;
  options.mode = Mode::kLayup;
  options.cpu_workers = 1;
  const BenchmarkResult result = run_benchmark(options);
  EXPECT_EQ(result.memory_plan["mode"], "layup");
  size_t accounted = 0;
  for (const nlohmann::json& allocation : result.memory_plan["allocations"])
    if (allocation["accounted"]) accounted += allocation["bytes"].get<size_t>();
  EXPECT_EQ(result.memory_measured["total"]["peak_bytes"].get<size_t>(), accounted);
  EXPECT_EQ(result.memory_measured_peak_bytes, accounted);
  const nlohmann::json json = benchmark_json(options, result, "layup bench");
  EXPECT_EQ(json["memory"]["plan"]["total_bytes"], result.memory_plan_bytes);

  options.memory_budget = size_t{100} << 10;  // 100K
  const std::string over = error_of([&] { run_benchmark(options); });
  EXPECT_NE(over.find("over --memory-budget 100.0 KiB"), std::string::npos) << over;
}

TEST(MemoryPlan, Gpt2LargeLayupKeepsTwoBlocksOfWeightGradsOnTheDevice) {
  const ModelConfig config = named_config("gpt2-large");
  // gpt2-large: C = 1280, 36 blocks of 12 C^2 + 13 C floats, embeddings (50304 + 1024) C, final
  // norm 2 C.
  const size_t block = 12 * 1280 * 1280 + 13 * 1280;  // 19,677,440
  const size_t embeddings = (50304 + 1024) * 1280;    // 65,699,840
  const size_t final_norm = 2 * 1280;
  const size_t all = embeddings + 36 * block + final_norm;  // 774,090,240
  ASSERT_EQ(all, ParameterLayout(config).total_count());

  for (const char* device_name : {"cpu", "cuda"}) {
    const std::string device = device_name;
    SCOPED_TRACE(device);
    MemoryPlanRequest request = cpu_request(config, "gpu", 8, 1024);
    request.model_name = "gpt2-large";
    if (device == "cuda") {
      request = on_a_discrete_gpu(request);
    }
    const MemoryPlan gpu = plan_memory(request);
    request.mode = Mode::kLayup;
    const MemoryPlan layup = plan_memory(request);
    EXPECT_EQ(gpu.bytes(MemorySide::kDevice, TensorClass::kWeightGrads), all * 4);
    EXPECT_EQ(layup.bytes(MemorySide::kDevice, TensorClass::kWeightGrads),
              (2 * block + embeddings + final_norm) * 4);
    const double expected = 1.0 - static_cast<double>(2 * block + embeddings + final_norm) / all;
    const double reduction = weight_grad_device_reduction(gpu, layup);
    EXPECT_DOUBLE_EQ(reduction, expected);
    EXPECT_NEAR(reduction, 0.8643, 0.0001);  // "about 86% less"
    std::printf("gpt2-large B=8 T=1024 (%s): device weight grads gpu %s, layup %s: %.2f%% less\n",
                device.c_str(),
                format_bytes(gpu.bytes(MemorySide::kDevice, TensorClass::kWeightGrads)).c_str(),
                format_bytes(layup.bytes(MemorySide::kDevice, TensorClass::kWeightGrads)).c_str(),
                100.0 * reduction);
  }
}

// A 16 GiB unified-memory board emulated on the CPU backend, where every byte of the run is host
// memory: the budget counts the device side and the host side together. In one memory, offload and
// layup compute with the master weights in place; layup with --clip none and one micro-batch also
// keeps no whole-model host gradient, so it needs a whole-model copy less than gpu mode (master
// weights and two moments against weights, gradient and two moments) and two less than offload.
// A unified-memory board (a Jetson AGX Orin has 32 GB for everything), emulated with
// --memory-budget: at gpt2-xl, B=1, T=1024 only layup fits. Every mode also holds one span's state
// on its way into the schedule or out to a checkpoint, and the checkpoint writer's scratch
// (transient).
TEST(MemoryPlan, UnifiedMemoryBoardBudgetOnTheCpuBackend) {
  const ModelConfig config = named_config("gpt2-xl");
  const MemoryBudgets budgets = parse_memory_budgets("32G", "", "");
  ASSERT_EQ(*budgets.total, size_t{32} << 30);
  auto plan = [&](const std::string& mode, int batch, int seq_len, float clip) {
    MemoryPlanRequest request = cpu_request(config, mode, batch, seq_len);
    request.model_name = "gpt2-xl";
    request.clip = clip;
    return plan_memory(request);
  };

  // At the full context (the CPU backend keeps every block's B x 25 x T x T attention
  // probabilities, ~4.7 GiB at B=1, T=1024) layup fits, computing on the master weights in place
  // and updating each block straight from its slot.
  const MemoryPlan layup = plan("layup", 1, 1024, 0.0f);
  EXPECT_TRUE(schedule_of(layup).weights_in_place);
  EXPECT_FALSE(schedule_of(layup).host_gradient);
  EXPECT_EQ(layup.bytes(MemorySide::kDevice, TensorClass::kWeights), 0u);
  EXPECT_EQ(layup.bytes(MemorySide::kHost, TensorClass::kWeightGrads), 0u);
  EXPECT_TRUE(fits(layup, budgets));
  EXPECT_EQ(refusal(layup, budgets), "");

  // gpu mode at the same batch is refused, naming its largest class (the activations).
  const MemoryPlan gpu = plan("gpu", 1, 1024, 0.0f);
  const std::string gpu_message = refusal(gpu, budgets);
  EXPECT_NE(gpu_message.find("gpt2-xl in gpu mode at B=1, T=1024"), std::string::npos)
      << gpu_message;
  EXPECT_NE(gpu_message.find("over --memory-budget 32.00 GiB"), std::string::npos) << gpu_message;
  EXPECT_NE(gpu_message.find("--mode layup"), std::string::npos) << gpu_message;

  // offload too: a whole gradient on the device side and another on the host side.
  const MemoryPlan offload = plan("offload", 1, 1024, 0.0f);
  const std::string offload_message = refusal(offload, budgets);
  EXPECT_NE(offload_message.find("gpt2-xl in offload mode at B=1, T=1024"), std::string::npos)
      << offload_message;
  EXPECT_NE(offload_message.find("over --memory-budget 32.00 GiB"), std::string::npos);

  // layup with clipping keeps the whole gradient on the host (design (a)): refused here too.
  const MemoryPlan clipped = plan("layup", 1, 1024, 1.0f);
  EXPECT_TRUE(schedule_of(clipped).host_gradient);
  EXPECT_FALSE(fits(clipped, budgets));

  // So do several ranks unclipped: each host span's gradient is summed over them there.
  MemoryPlanRequest ranked = cpu_request(config, "layup", 1, 1024);
  ranked.clip = 0.0f;
  ranked.ranks = 2;
  EXPECT_TRUE(schedule_of(plan_memory(ranked)).host_gradient);

  // The saving is exact: gpu needs one whole-model fp32 copy more than layup, less the slots.
  const ParameterLayout layout(config);
  const size_t model = layout.total_count() * sizeof(float);
  const size_t slots = 2 * layout.block().count * sizeof(float);
  const size_t head = (layout.embeddings().count + layout.final_norm().count) * sizeof(float);
  EXPECT_EQ(gpu.total_bytes() - layup.total_bytes(), model - slots - head);
  // The transient state is one span's parameters and both moments, and the checkpoint writer's
  // scratch: a chunk and a transposed matrix, a tensor each at most, and the file writer's two
  // buffers.
  size_t largest_tensor = 0, largest_span = 0;
  for (const TensorSpec& tensor : layout.tensors())
    largest_tensor = std::max(largest_tensor, tensor.count * sizeof(float));
  for (const Span& span : layout.spans())
    largest_span = std::max(largest_span, span.count * sizeof(float));
  EXPECT_EQ(layup.transient_bytes(),
            3 * largest_span + 2 * largest_tensor + 2 * kStreamedWriteBufferBytes);
  // A compact kind's moments travel coded: one rank's tiers take the coded span as it is; with
  // several ranks a rank's part is coded again from its first element, one more coded span.
  MemoryPlanRequest compact = cpu_request(config, "layup", 1, 1024);
  compact.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  const size_t coded =
      optimizer_moments_padded_bytes(compact.optimizer_state, largest_span / sizeof(float));
  EXPECT_EQ(plan_memory(compact).transient_bytes(),
            largest_span + coded + 2 * largest_tensor + 2 * kStreamedWriteBufferBytes);
  compact.ranks = 2;
  EXPECT_EQ(plan_memory(compact).transient_bytes(),
            largest_span + 2 * coded + 2 * largest_tensor + 2 * kStreamedWriteBufferBytes);
  for (int seq_len : {1, 128, 1024}) {
    std::printf(
        "gpt2-xl B=1 T=%d on the CPU backend, at the peak: gpu %s, offload %s, layup %s "
        "(--clip none; %s with clipping)\n",
        seq_len, format_bytes(plan("gpu", 1, seq_len, 0.0f).total_bytes()).c_str(),
        format_bytes(plan("offload", 1, seq_len, 0.0f).total_bytes()).c_str(),
        format_bytes(plan("layup", 1, seq_len, 0.0f).total_bytes()).c_str(),
        format_bytes(plan("layup", 1, seq_len, 1.0f).total_bytes()).c_str());
  }
}

// layup's speculative clipping keeps a spare copy of the master weights and moments: exactly
// three whole-model fp32 copies more than deferred clipping, and a budget between the two is
// refused with --layup-clip deferred as the first way to fit.
TEST(MemoryPlan, SpeculativeClippingPlansItsSpareStateAndDeferredIsOffered) {
  const ModelConfig config = named_config("gpt2-large");
  MemoryPlanRequest request = cpu_request(config, "layup", 1, 128);
  request.model_name = "gpt2-large";
  const MemoryPlan speculative = plan_memory(request);
  request.layup_clip = LayupClip::kDeferred;
  const MemoryPlan deferred = plan_memory(request);
  EXPECT_TRUE(schedule_of(speculative).speculative_clip);
  EXPECT_FALSE(schedule_of(deferred).speculative_clip);
  const size_t model = ParameterLayout(config).total_count() * sizeof(float);
  EXPECT_EQ(speculative.total_bytes() - deferred.total_bytes(), 3 * model);
  EXPECT_EQ(speculative.bytes(MemorySide::kHost, TensorClass::kMasterWeights), 2 * model);
  EXPECT_EQ(speculative.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments), 4 * model);

  MemoryBudgets budgets;
  budgets.total = deferred.total_bytes() + model;
  const std::string message = refusal(speculative, budgets);
  EXPECT_NE(message.find("Within the budget: --layup-clip deferred"), std::string::npos) << message;
  EXPECT_EQ(refusal(deferred, budgets), "");

  // auto (the default) speculates except on an integrated GPU, whose one memory holds everything.
  request.layup_clip = LayupClip::kAuto;
  EXPECT_TRUE(plan_run_memory(request).schedule.speculative_clip);
  request = on_a_discrete_gpu(request);
  EXPECT_TRUE(plan_run_memory(request).schedule.speculative_clip);
  request.attributes.integrated = true;
  const MemoryPlan on_a_board = plan_memory(request);
  EXPECT_FALSE(schedule_of(on_a_board).speculative_clip);
  bool said_so = false;
  for (const std::string& note : on_a_board.notes)
    said_so |= note.find("clipping in layup is deferred") != std::string::npos;
  EXPECT_TRUE(said_so) << "the plan does not say that auto chose deferred clipping";
  request.layup_clip = LayupClip::kSpeculative;
  EXPECT_TRUE(plan_run_memory(request).schedule.speculative_clip);

  // Without clipping there is nothing to speculate on.
  request.clip = 0.0f;
  request.layup_clip = LayupClip::kSpeculative;
  EXPECT_FALSE(plan_run_memory(request).schedule.speculative_clip);
}

// --layup-head: auto updates the embeddings and the final norm on a discrete GPU (their moments in
// device memory; the weight gradients on the device are the same, plus the head's sum with
// accumulation), and on the host where the device computes with the master weights in place or
// on an integrated GPU.
// device is refused where it cannot work, saying what to use; a device budget that the head's
// moments break offers --layup-head host.
TEST(MemoryPlan, LayupUpdatesTheHeadOnADiscreteGpu) {
  const ModelConfig config = named_config("gpt2");
  const ParameterLayout layout(config);
  const size_t head = (layout.embeddings().count + layout.final_norm().count) * sizeof(float);
  MemoryPlanRequest request = cpu_request(config, "layup", 32, 1024);
  request.model_name = "gpt2";
  EXPECT_FALSE(updates_head_on_device(plan_run_memory(request).schedule))
      << "the CPU backend computes in place";
  request = on_a_discrete_gpu(request);
  const MemoryPlan on_device = plan_memory(request);
  EXPECT_TRUE(updates_head_on_device(schedule_of(on_device)));
  EXPECT_EQ(schedule_of(on_device, 1).update_sites, head_on_device(layout));
  request.layup_head = LayupHead::kHost;
  const MemoryPlan on_host = plan_memory(request);
  EXPECT_FALSE(updates_head_on_device(schedule_of(on_host)));
  EXPECT_TRUE(schedule_of(on_host, 1).update_sites.empty());
  EXPECT_EQ(on_device.bytes(MemorySide::kDevice, TensorClass::kOptimizerMoments), 2 * head);
  EXPECT_EQ(on_host.bytes(MemorySide::kDevice, TensorClass::kOptimizerMoments), 0u);
  EXPECT_EQ(on_device.bytes(MemorySide::kDevice, TensorClass::kWeightGrads),
            on_host.bytes(MemorySide::kDevice, TensorClass::kWeightGrads));
  // The host keeps no state of the spans the device updates (nor a spare copy of it, where
  // clipping speculates).
  const size_t copies = schedule_of(on_device).speculative_clip ? 2 : 1;
  EXPECT_EQ(on_host.bytes(MemorySide::kHost, TensorClass::kMasterWeights) -
                on_device.bytes(MemorySide::kHost, TensorClass::kMasterWeights),
            copies * head);
  EXPECT_EQ(on_host.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments) -
                on_device.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments),
            copies * 2 * head);
  bool said_so = false;
  for (const std::string& note : on_device.notes)
    said_so |=
        note.find("updates the embeddings and the final norm on the device") != std::string::npos;
  EXPECT_TRUE(said_so) << "the plan does not say where the head is updated";

  // A device budget the head's moments break: --layup-head host fits.
  MemoryBudgets budgets;
  budgets.device = on_host.bytes(MemorySide::kDevice) + head;
  EXPECT_NE(refusal(on_device, budgets).find("--layup-head host (needs"), std::string::npos)
      << refusal(on_device, budgets);
  EXPECT_EQ(refusal(on_host, budgets), "");

  // Accumulating micro-batches: the device sums the head's gradient in a buffer of its own.
  request.layup_head = LayupHead::kAuto;
  request.grad_accum = 2;
  const MemoryPlan accumulating = plan_memory(request);
  EXPECT_TRUE(updates_head_on_device(schedule_of(accumulating)));
  EXPECT_EQ(accumulating.bytes(MemorySide::kDevice, TensorClass::kWeightGrads),
            on_device.bytes(MemorySide::kDevice, TensorClass::kWeightGrads) + head);
  request.grad_accum = 1;

  // auto keeps the head on the host where the device cannot or should not update it.
  request.place = parse_place_overrides({"weights=pinned"});
  EXPECT_FALSE(updates_head_on_device(plan_run_memory(request).schedule))
      << "the weights computed in place";
  request.place.clear();
  request.attributes.integrated = true;
  EXPECT_FALSE(updates_head_on_device(plan_run_memory(request).schedule)) << "an integrated GPU";
  request.attributes.integrated = false;
  request.mode = Mode::kOffload;
  EXPECT_FALSE(updates_head_on_device(plan_run_memory(request).schedule)) << "offload mode";
  request.mode = Mode::kLayup;

  // device where it cannot work: refused, saying what to use.
  request.layup_head = LayupHead::kDevice;
  EXPECT_TRUE(updates_head_on_device(plan_run_memory(request).schedule));
  request.place = parse_place_overrides({"weights=pinned"});
  const std::string no_copy = error_of([&] { plan_memory(request); });
  EXPECT_NE(no_copy.find("use --layup-head host"), std::string::npos) << no_copy;
  request = cpu_request(config, "layup", 1, 64);
  request.layup_head = LayupHead::kDevice;
  EXPECT_THROW(plan_memory(request), Error);
}

// --layup-head auto under a budget: the head goes to the host where only that fits (before any
// block goes to disk), and auto never refuses a run that some explicit head and optimizer
// placement fit, over a grid of device and host budgets.
TEST(MemoryPlan, AutoNeverRefusesWhatAnExplicitHeadAndPlacementFit) {
  const ModelConfig config = gpt2_config(4, 2, 64, 32, 4000);
  const ParameterLayout layout(config);
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 2, 32));
  request.layup_clip = LayupClip::kDeferred;
  request.offload_dir = "/offload";
  const auto explicit_plan = [&](LayupHead head, int device, int disk) {
    MemoryPlanRequest r = request;
    r.layup_head = head;
    r.optimizer_placement = OptimizerPlacement::parse(
        "device:" + std::to_string(device) + (disk > 0 ? ",disk:" + std::to_string(disk) : ""));
    return plan_memory(r);
  };
  std::vector<MemoryPlan> choices;
  for (const LayupHead head : {LayupHead::kDevice, LayupHead::kHost})
    for (int device = 0; device <= config.n_layer; ++device)
      for (int disk = 0; device + disk <= config.n_layer; ++disk)
        choices.push_back(explicit_plan(head, device, disk));

  // The head's state breaks a device budget that two blocks' fit with the head on the host.
  MemoryBudgets budgets;
  budgets.device = explicit_plan(LayupHead::kHost, 2, 0).bytes(MemorySide::kDevice);
  ASSERT_GT(explicit_plan(LayupHead::kDevice, 0, 0).bytes(MemorySide::kDevice), *budgets.device);
  const MemoryPlanRequest resolved = resolve_optimizer_placement(request, budgets);
  EXPECT_EQ(resolved.layup_head, LayupHead::kHost);
  EXPECT_EQ(resolved.optimizer_placement.name(), "auto (device:2)");
  EXPECT_EQ(refusal(plan_memory(resolved), budgets), "");

  std::vector<size_t> device_sizes, host_sizes;
  for (const MemoryPlan& plan : choices) {
    device_sizes.push_back(plan.bytes(MemorySide::kDevice));
    host_sizes.push_back(plan.bytes(MemorySide::kHost));
  }
  int checked = 0;
  for (const size_t device : device_sizes)
    for (const size_t host : host_sizes) {
      budgets.device = device;
      budgets.host = host;
      const bool some_fits =
          std::any_of(choices.begin(), choices.end(),
                      [&](const MemoryPlan& plan) { return fits(plan, budgets); });
      if (!some_fits) continue;
      ++checked;
      const MemoryPlanRequest automatic = resolve_optimizer_placement(request, budgets);
      EXPECT_TRUE(fits(plan_memory(automatic), budgets))
          << "device budget " << device << ", host budget " << host << ": auto chose "
          << automatic.optimizer_placement.name() << " with the head on the "
          << (automatic.layup_head == LayupHead::kHost ? "host" : "device");
    }
  EXPECT_GT(checked, 100);
}

// The same with streamed blocks among the explicit choices, and with the head or the streamed
// count given while the placement is auto: whatever explicit choices fit a pair of budgets, auto
// for the rest fits it too. The budgets are a sample of the choices' own sizes, on both sides.
TEST(MemoryPlan, AutoNeverRefusesWhatExplicitChoicesWithStreamedBlocksFit) {
  const ModelConfig config = gpt2_config(4, 2, 64, 32, 61);  // the blocks outweigh the head
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 2, 32));
  request.layup_clip = LayupClip::kDeferred;
  request.recompute = 3;
  request.offload_dir = "/offload";
  struct Choice {
    LayupHead head;
    int streamed;
    MemoryPlan plan;
  };
  std::vector<Choice> choices;
  for (const LayupHead head : {LayupHead::kDevice, LayupHead::kHost})
    for (int device = 0; device <= config.n_layer; ++device)
      for (int disk = 0; device + disk <= config.n_layer; ++disk)
        for (int streamed = 0; device + streamed <= config.n_layer; ++streamed) {
          MemoryPlanRequest r = request;
          r.layup_head = head;
          r.optimizer_placement =
              OptimizerPlacement::parse("device:" + std::to_string(device) +
                                        (disk > 0 ? ",disk:" + std::to_string(disk) : ""));
          r.streamed_blocks = StreamedBlocks::parse(std::to_string(streamed));
          try {
            choices.push_back({head, streamed, plan_memory(r)});
          } catch (const Error&) {  // a combination the planner refuses is no choice
          }
        }
  ASSERT_GT(choices.size(), 100u);

  // Every second of the choices' sizes on each side, sorted: from the smallest to the largest.
  std::vector<size_t> device_sizes, host_sizes;
  for (const Choice& choice : choices) {
    device_sizes.push_back(choice.plan.bytes(MemorySide::kDevice));
    host_sizes.push_back(choice.plan.bytes(MemorySide::kHost));
  }
  const auto sample = [](std::vector<size_t> sizes) {
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    std::vector<size_t> every_second;
    for (size_t i = 0; i < sizes.size(); i += 2) every_second.push_back(sizes[i]);
    if (every_second.back() != sizes.back()) every_second.push_back(sizes.back());
    return every_second;
  };
  // What auto leaves to the planner: all three, or the placement with the head or the streamed
  // count given (-1: auto).
  struct Asked {
    LayupHead head;
    int streamed;
  };
  std::vector<Asked> asked = {
      {LayupHead::kAuto, -1}, {LayupHead::kDevice, -1}, {LayupHead::kHost, -1}};
  for (int streamed = 0; streamed <= config.n_layer; ++streamed)
    asked.push_back({LayupHead::kAuto, streamed});
  int checked = 0, streaming = 0;
  MemoryBudgets budgets;
  for (const size_t device : sample(device_sizes))
    for (const size_t host : sample(host_sizes)) {
      budgets.device = device;
      budgets.host = host;
      for (const Asked& ask : asked) {
        const bool some_fits = std::any_of(choices.begin(), choices.end(), [&](const Choice& c) {
          return (ask.head == LayupHead::kAuto || c.head == ask.head) &&
                 (ask.streamed < 0 || c.streamed == ask.streamed) && fits(c.plan, budgets);
        });
        if (!some_fits) continue;
        ++checked;
        MemoryPlanRequest automatic = request;
        automatic.layup_head = ask.head;
        if (ask.streamed >= 0)
          automatic.streamed_blocks = StreamedBlocks::parse(std::to_string(ask.streamed));
        automatic = resolve_optimizer_placement(automatic, budgets);
        streaming += ask.streamed < 0 && automatic.streamed_blocks.blocks() > 0;
        EXPECT_TRUE(fits(plan_memory(automatic), budgets))
            << "device budget " << device << ", host budget " << host << ", head "
            << name_of(ask.head) << ", streamed blocks "
            << (ask.streamed < 0 ? "auto" : std::to_string(ask.streamed)) << ": auto chose "
            << automatic.optimizer_placement.name() << ", streamed blocks "
            << automatic.streamed_blocks.name() << ", the head on the "
            << name_of(automatic.layup_head);
      }
    }
  EXPECT_GT(checked, 500);
  EXPECT_GT(streaming, 0);  // the grid reaches budgets where auto streams blocks
}

TEST(MemoryPlan, PlacementIsCheckedAgainstTheDevice) {
  const ModelConfig config = tiny_config();
  MemoryPlanRequest request = cpu_request(config, "layup", 1, 8);
  request.place = parse_place_overrides({"grads=device"});
  const std::string host_only = error_of([&] { plan_memory(request); });
  EXPECT_NE(host_only.find("the CPU backend has only host memory"), std::string::npos) << host_only;
  request.place = parse_place_overrides({"grads=host"});
  EXPECT_NO_THROW(plan_memory(request));

  // A discrete GPU (the attributes our H200 reports).
  request = on_a_discrete_gpu(request);
  request.attributes.queried = false;
  request.attributes.pageable_memory_access = false;
  request.attributes.concurrent_managed_access = true;
  request.place = {};
  const MemoryPlan defaults = plan_memory(request);
  EXPECT_EQ(defaults.placement[TensorClass::kWeightGrads], MemoryKind::kDevice);
  // Copied to the GPU after every update, so pinned; the moments only the CPU touches.
  EXPECT_EQ(defaults.placement[TensorClass::kMasterWeights], MemoryKind::kPinnedMapped);
  EXPECT_EQ(defaults.placement[TensorClass::kOptimizerMoments], MemoryKind::kHost);

  // The schedules' classes are allocated where they are placed: the plan says so per buffer.
  request.place = parse_place_overrides({"grads=pinned", "moments=managed", "activations=pinned"});
  const MemoryPlan placed = plan_memory(request);
  EXPECT_EQ(placed.placement[TensorClass::kWeightGrads], MemoryKind::kPinnedMapped);
  for (const PlannedAllocation& a : placed.allocations) {
    SCOPED_TRACE(a.what);
    if (a.transient) continue;  // the state on its way in or out, in plain host memory
    if (a.tensor_class == TensorClass::kWeightGrads) {
      // Device side as placed; the host accumulator keeps the kind the device copies into
      // fastest (pinned too, here).
      EXPECT_EQ(a.kind, MemoryKind::kPinnedMapped);
    } else if (a.tensor_class == TensorClass::kOptimizerMoments) {
      // The host's, as placed; the head's, updated on the device, in device memory.
      EXPECT_EQ(a.kind, a.side == MemorySide::kHost ? MemoryKind::kManaged : MemoryKind::kDevice);
    }
  }
  // The backend's activations too; its library workspaces stay in device memory.
  size_t pinned_activations = 0;
  for (const PlannedAllocation& a : placed.allocations) {
    if (a.tensor_class == TensorClass::kActivations) {
      EXPECT_EQ(a.kind, MemoryKind::kPinnedMapped) << a.what;
      pinned_activations += a.bytes;
    }
    if (a.what == "cuBLASLt workspace") {
      EXPECT_EQ(a.kind, MemoryKind::kDevice);
    }
  }
  EXPECT_GT(pinned_activations, 0u);
  // With clipping (a host gradient) the bytes do not depend on the placement.
  EXPECT_EQ(placed.total_bytes(), defaults.total_bytes());
  // Without it, gradients placed where the host reads them need no landing buffers.
  request.clip = 0.0f;
  request.place = {};
  const size_t landing = plan_memory(request).bytes(MemorySide::kHost, TensorClass::kWeightGrads);
  EXPECT_GT(landing, 0u);
  request.place = parse_place_overrides({"grads=pinned"});
  EXPECT_EQ(plan_memory(request).bytes(MemorySide::kHost, TensorClass::kWeightGrads), 0u);
  request.clip = 1.0f;
  // Computing with the master weights in place needs them where the GPU reads.
  request.place = parse_place_overrides({"weights=pinned", "master=host"});
  EXPECT_THROW(plan_memory(request), Error);

  auto refused = [&](const std::vector<std::string>& place, const std::string& why) {
    request.place = parse_place_overrides(place);
    try {
      plan_memory(request);
      ADD_FAILURE() << place[0] << " accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(why), std::string::npos) << error.what();
    }
  };
  refused({"weights=pageable"}, "cannot access pageable host memory");
  refused({"master=device"}, "AdamW runs on the CPU");
  refused({"activations=host"}, "plain host memory is the CPU's alone");
  // An integrated board without concurrent managed access (a Jetson Orin).
  request.attributes.integrated = true;
  request.attributes.concurrent_managed_access = false;
  refused({"grads=managed"}, "concurrent managed access = 0");
}

TEST(MemoryPlan, ParsesSizes) {
  EXPECT_EQ(parse_memory_size("16G", "--memory-budget"), size_t{16} << 30);
  EXPECT_EQ(parse_memory_size("512M", "--memory-budget"), size_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5GiB", "--memory-budget"), size_t{3} << 29);
  EXPECT_EQ(parse_memory_size("16GB", "--memory-budget"), size_t{16000000000});
  EXPECT_EQ(parse_memory_size("4096", "--memory-budget"), 4096u);
  EXPECT_EQ(parse_memory_size("2k", "--memory-budget"), 2048u);
  for (const char* bad : {"", "G", "abc", "-1G", "16X", "0", "16 G"}) {
    try {
      parse_memory_size(bad, "--host-budget");
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("--host-budget takes a positive size"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(MemoryPlan, DeviceAndHostBudgetsCountTheirSideOnly) {
  const ModelConfig config = tiny_config();
  const MemoryPlan plan = plan_memory(cpu_request(config, "layup", 2, 8));
  MemoryBudgets budgets;
  budgets.device = plan.bytes(MemorySide::kDevice);
  budgets.host = plan.bytes(MemorySide::kHost);
  EXPECT_TRUE(fits(plan, budgets));
  budgets.host = plan.bytes(MemorySide::kHost) - 1;
  const std::string message = refusal(plan, budgets);
  EXPECT_NE(message.find("on the host side, over --host-budget"), std::string::npos) << message;
}

// A --device-budget on a GPU stands for a card of that size: a plan gets it less the card's CUDA
// context and the reserve a real card's check keeps (24 GiB: 0.5 + 1 GiB).
TEST(MemoryPlan, ADeviceBudgetOnAGpuKeepsTheCardsReserve) {
  EXPECT_EQ(device_budget_reserve(size_t{24} << 30), size_t{3} << 29);
  EXPECT_EQ(device_budget_reserve(size_t{100} << 30), (size_t{1} << 29) + (size_t{2} << 30));
  const MemoryPlan plan = plan_memory(on_a_discrete_gpu(cpu_request(tiny_config(), "layup", 2, 8)));
  MemoryBudgets budgets;
  budgets.device = plan.bytes(MemorySide::kDevice) + device_budget_reserve(size_t{1} << 30);
  budgets.device_reserve = device_budget_reserve(*budgets.device);
  EXPECT_TRUE(fits(plan, budgets));
  budgets.device = *budgets.device - 1;
  budgets.device_reserve = device_budget_reserve(*budgets.device);
  const std::string message = refusal(plan, budgets);
  EXPECT_NE(message.find("over what --device-budget"), std::string::npos) << message;
  EXPECT_NE(message.find("for the CUDA context"), std::string::npos) << message;
  // Every run's budgets go through with_machine_limit with the device it resolved to (`--device
  // auto` on a GPU machine too): a discrete GPU keeps the reserve, the CPU none.
  MemoryBudgets asked;
  asked.device = size_t{24} << 30;
  HostMemoryLimit host;
  host.available_bytes = size_t{1} << 40;
  EXPECT_EQ(with_machine_limit(asked, host, false, plan.request.attributes).device_reserve,
            size_t{3} << 29);
  EXPECT_EQ(with_machine_limit(asked, host, true, plan.request.attributes).device_reserve,
            size_t{3} << 29);
  EXPECT_EQ(with_machine_limit(asked, host, false, {}).device_reserve, 0u);
}

// Every plan is checked against what this machine's host memory can give the run: the plan's
// bytes in host memory at its peak, transients included.
TEST(MemoryPlan, TheMachinesHostMemoryIsALimitToo) {
  const MemoryPlan plan = plan_memory(cpu_request(tiny_config(), "layup", 2, 8));
  EXPECT_EQ(plan.host_memory_bytes(), plan.total_bytes());  // the CPU backend: one memory
  HostMemoryLimit machine;
  machine.reserve_bytes = size_t{1} << 20;
  machine.available_bytes = plan.host_memory_bytes() + machine.reserve_bytes;
  EXPECT_TRUE(fits(plan, with_machine_limit({}, machine, false)));
  machine.available_bytes -= 1;
  const MemoryBudgets tight = with_machine_limit({}, machine, false);
  EXPECT_FALSE(fits(plan, tight));
  const std::string message = refusal(plan, tight);
  EXPECT_NE(message.find("of host memory at its peak"), std::string::npos) << message;
  EXPECT_NE(message.find("MemAvailable"), std::string::npos) << message;
  EXPECT_NE(message.find("over what this machine's host memory can give it"), std::string::npos)
      << message;
  // --allow-overcommit drops the machine's limit.
  EXPECT_TRUE(fits(plan, with_machine_limit({}, machine, true)));

  // A --host-budget can lower the machine's limit, not raise it.
  MemoryBudgets lower;
  lower.host = machine.usable_bytes() / 2;
  EXPECT_EQ(*with_machine_limit(lower, machine, false).host, machine.usable_bytes() / 2);
  MemoryBudgets higher;
  higher.host = machine.usable_bytes() + 1;
  const std::string raised = error_of([&] { with_machine_limit(higher, machine, false); });
  EXPECT_NE(raised.find("--allow-overcommit"), std::string::npos) << raised;
  EXPECT_EQ(error_of([&] { with_machine_limit(higher, machine, true); }), "");
}

// A discrete GPU's free memory (as the driver reported it) is a limit too, less a reserve.
TEST(MemoryPlan, TheGpusFreeMemoryIsALimitToo) {
  MemoryPlanRequest request = cpu_request(tiny_config(), "gpu", 2, 8);
  request = on_a_discrete_gpu(request);
  request.attributes.queried = true;
  request.attributes.name = "test GPU";
  request.attributes.total_bytes = size_t{80} << 30;
  const MemoryPlan plan = plan_memory(request);
  const size_t reserve = (size_t{80} << 30) / 50;
  EXPECT_GT(plan.gpu_memory_bytes(), 0u);
  request.attributes.free_bytes = plan.gpu_memory_bytes() + reserve;
  HostMemoryLimit host;
  host.available_bytes = size_t{1} << 40;
  EXPECT_TRUE(fits(plan, with_machine_limit({}, host, false, request.attributes)));
  request.attributes.free_bytes -= 1;
  const MemoryBudgets tight = with_machine_limit({}, host, false, request.attributes);
  EXPECT_FALSE(fits(plan, tight));
  const std::string message = refusal(plan, tight);
  EXPECT_NE(message.find("of the GPU's memory, over what the GPU has free"), std::string::npos)
      << message;
  EXPECT_NE(message.find("test GPU"), std::string::npos) << message;
  // Attributes not read from a GPU set no limit.
  request.attributes.queried = false;
  EXPECT_FALSE(with_machine_limit({}, host, false, request.attributes).machine_gpu);
}

// On a discrete GPU the host's memory holds the pinned and plain host buffers, not the device's.
TEST(MemoryPlan, OnADiscreteGpuTheHostMemoryIsWhatIsNotInDeviceMemory) {
  MemoryPlanRequest request = cpu_request(tiny_config(), "layup", 2, 8);
  request = on_a_discrete_gpu(request);
  request.data_bytes = 12345;
  const MemoryPlan plan = plan_memory(request);
  size_t host_kinds = 0;
  bool data_planned = false;
  for (const PlannedAllocation& a : plan.allocations) {
    if (a.kind != MemoryKind::kDevice && a.kind != MemoryKind::kManaged) host_kinds += a.bytes;
    data_planned |= a.bytes == 12345 && a.side == MemorySide::kHost;
  }
  EXPECT_TRUE(data_planned);
  EXPECT_EQ(plan.host_memory_bytes(), host_kinds);
  EXPECT_LT(plan.host_memory_bytes(), plan.total_bytes());
  EXPECT_GT(plan.transient_bytes(), 0u);
}

}  // namespace
}  // namespace layup

namespace layup {
namespace {

// --optimizer-placement: device:K puts the first K blocks' state on the device and takes it off
// the host; auto takes as many as the device budget admits and no more; on the CPU backend none.
TEST(MemoryPlan, OptimizerPlacementSplitsTheBlocksBetweenDeviceAndHost) {
  const ModelConfig config = named_config("gpt2");
  const ParameterLayout layout(config);
  const size_t block = layout.block().count * sizeof(float);
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 8, 1024));
  request.layup_clip = LayupClip::kDeferred;
  request.optimizer_placement = OptimizerPlacement::parse("host");
  const MemoryPlan host = plan_memory(request);
  request.optimizer_placement = OptimizerPlacement::parse("device:4");
  const MemoryPlan four = plan_memory(request);
  const ScheduleOptions options = schedule_of(four);
  for (int layer = 0; layer < config.n_layer; ++layer)
    EXPECT_EQ(options.update_sites[1 + layer], layer < 4 ? UpdateSite::kDevice : UpdateSite::kHost)
        << "block " << layer;
  EXPECT_TRUE(options.weights_land_in_compute_copy) << "bf16 on a discrete GPU";
  // Off the host: master weights, m, v and the accumulated gradient of four blocks.
  EXPECT_EQ(host.bytes(MemorySide::kHost, TensorClass::kMasterWeights) -
                four.bytes(MemorySide::kHost, TensorClass::kMasterWeights),
            4 * block);
  EXPECT_EQ(host.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments) -
                four.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments),
            2 * 4 * block);
  // Onto the device: their moments, and their fp32 weights (the device keeps none of the
  // host-updated spans', whose weights land in the bf16 compute copy).
  EXPECT_EQ(four.bytes(MemorySide::kDevice, TensorClass::kOptimizerMoments) -
                host.bytes(MemorySide::kDevice, TensorClass::kOptimizerMoments),
            2 * 4 * block);
  EXPECT_EQ(four.bytes(MemorySide::kDevice, TensorClass::kWeights) -
                host.bytes(MemorySide::kDevice, TensorClass::kWeights),
            4 * block);

  // Every span's weights land through the staging at import, even with every block on the device.
  request.optimizer_placement = OptimizerPlacement::parse("device:12");
  bool staged = false;
  for (const PlannedAllocation& allocation : plan_memory(request).allocations)
    staged |= allocation.what.find("staging of host-updated weights") != std::string::npos;
  EXPECT_TRUE(staged);

  // auto against a device budget: the most blocks that fit, and one more would not.
  MemoryBudgets budgets;
  budgets.device = four.bytes(MemorySide::kDevice) + block;  // room for the fifth block's weights
  request.optimizer_placement = {};
  const MemoryPlanRequest resolved = resolve_optimizer_placement(request, budgets);
  EXPECT_EQ(resolved.optimizer_placement.device_blocks, 4);
  EXPECT_EQ(resolved.optimizer_placement.name(), "auto (device:4)");
  EXPECT_EQ(refusal(plan_memory(resolved), budgets), "");
  request.optimizer_placement = OptimizerPlacement::parse("device:5");
  const std::string over = refusal(plan_memory(request), budgets);
  EXPECT_NE(over.find("--optimizer-placement auto"), std::string::npos) << over;
  // No device budget on a GPU of unknown size: every block.
  request.optimizer_placement = {};
  EXPECT_EQ(resolve_optimizer_placement(request, {}).optimizer_placement.device_blocks,
            config.n_layer);

  // The CPU backend computes with the master weights in place: auto is host, device:K refused.
  MemoryPlanRequest on_cpu = cpu_request(tiny_config(), "layup", 2, 8);
  EXPECT_EQ(resolve_optimizer_placement(on_cpu, {}).optimizer_placement.blocks_on_device(), 0);
  on_cpu.optimizer_placement = OptimizerPlacement::parse("device:1");
  EXPECT_NE(error_of([&] { plan_memory(on_cpu); }).find("use --optimizer-placement host"),
            std::string::npos);
  EXPECT_THROW(OptimizerPlacement::parse("device:"), Error);
  EXPECT_THROW(OptimizerPlacement::parse("gpu"), Error);
  request.optimizer_placement = OptimizerPlacement::parse("device:13");
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("more blocks than the model's 12"),
            std::string::npos);
}

// --optimizer-placement staged:S: S of the blocks the host would update spread over them, their
// state on the host and their AdamW on the device through two slots in device memory, which the
// plan lists and the CPU backend's accountant measures (offload and layup, after a step); the
// plan's step stages them and the step-time model times its tasks. gpu mode, blocks on disk and
// a count past the model are refused.
TEST(MemoryPlan, StagedBlocksTakeTheirSlotsOnTheDevice) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  constexpr int kBatch = 2, kSeqLen = 8;
  for (const char* mode : {"offload", "layup"}) {
    SCOPED_TRACE(mode);
    MemoryPlanRequest request = cpu_request(config, mode, kBatch, kSeqLen, 2);
    request.optimizer_placement = OptimizerPlacement::parse("staged:2");
    const RunMemory run = plan_run_memory(request, 1);
    // Of the three blocks, the second and the third: (c + 1) 2 / 3 passes a whole number.
    const std::vector<UpdateSite>& sites = run.schedule.update_sites;
    ASSERT_EQ(sites.size(), layout.spans().size());
    EXPECT_EQ(sites[1], UpdateSite::kHost);
    EXPECT_EQ(sites[2], UpdateSite::kStaged);
    EXPECT_EQ(sites[3], UpdateSite::kStaged);
    EXPECT_EQ(run.step.staging_slots, 2);
    size_t slots = 0;
    for (const PlannedAllocation& a : run.plan.allocations)
      if (a.what.find("staging slots of the staged blocks") != std::string::npos) {
        EXPECT_EQ(a.side, MemorySide::kDevice) << a.what;
        slots += a.bytes;
      }
    // A gradient, master weights (the CPU backend computes with them in place) and fp32 moments.
    EXPECT_GE(slots, 2 * 4 * layout.block().count * sizeof(float));
    auto accountant = std::make_shared<MemoryAccountant>();
    std::unique_ptr<Schedule> schedule =
        make_schedule(run.plan.request.mode, make_cpu_backend(config, kBatch, kSeqLen, accountant),
                      make_cpu_device(accountant), layout, run.schedule);
    schedule->import_tensors(fresh_optimizer_tensors(layout, 7));
    ASSERT_TRUE(random_step(*schedule, config, kBatch, kSeqLen, 2, 1.0f).applied);
    for (MemorySide side : kAllMemorySides)
      for (TensorClass c : kAllTensorClasses)
        for (MemoryKind kind : kAllMemoryKinds)
          EXPECT_EQ(accountant->cell(side, c, kind).peak, run.plan.accounted_bytes(side, c, kind))
              << memory_side_name(side) << " " << tensor_class_label(c) << " "
              << memory_kind_name(kind);
    expect_one_step_plan(run);
    bool noted = false;
    for (const std::string& note : run.plan.notes)
      noted |= note.find(
                   "2 of 3 blocks keep their optimizer state on the host and are updated "
                   "by the device's AdamW") != std::string::npos;
    EXPECT_TRUE(noted);
  }
  EXPECT_EQ(OptimizerPlacement::parse("device:2,staged:12").name(), "device:2,staged:12");
  EXPECT_EQ(OptimizerPlacement::parse("staged:12").blocks_staged(), 12);
  EXPECT_THROW(OptimizerPlacement::parse("staged:x"), Error);
  EXPECT_THROW(OptimizerPlacement::parse("staged:1,staged:2"), Error);
  MemoryPlanRequest gpu = cpu_request(config, "gpu", kBatch, kSeqLen);
  gpu.optimizer_placement = OptimizerPlacement::parse("staged:1");
  EXPECT_NE(error_of([&] { plan_memory(gpu); }).find("gpu mode keeps all of it on the device"),
            std::string::npos);
  MemoryPlanRequest too_many = cpu_request(config, "layup", kBatch, kSeqLen);
  too_many.optimizer_placement = OptimizerPlacement::parse("staged:4");
  EXPECT_NE(error_of([&] { plan_memory(too_many); }).find("the model has 3"), std::string::npos);
  MemoryPlanRequest with_disk = too_many;
  with_disk.optimizer_placement = OptimizerPlacement::parse("disk:1,staged:1");
  with_disk.offload_dir = "/tmp";
  EXPECT_NE(error_of([&] { plan_memory(with_disk); }).find("not supported yet"), std::string::npos);
  // Several ranks on the CPU backend split every block's moments (ZeRO-1): no whole block to
  // stage. On GPUs every rank keeps the whole state, and stages as one rank does.
  MemoryPlanRequest ranked = cpu_request(config, "layup", kBatch, kSeqLen, 2);
  ranked.optimizer_placement = OptimizerPlacement::parse("staged:1");
  ranked.ranks = 2;
  EXPECT_NE(error_of([&] { plan_memory(ranked); }).find("(ZeRO-1)"), std::string::npos);
  ranked = on_a_discrete_gpu(ranked);
  EXPECT_EQ(plan_run_memory(ranked).schedule.update_sites[3], UpdateSite::kStaged);
  EXPECT_EQ(plan_run_memory(ranked).schedule.optimizer_shards, 1);

  // On a discrete GPU in bf16 the slots hold the master weights too (no fp32 copy to update in
  // place), beside the blocks placed on the device first.
  const ModelConfig gpt2 = named_config("gpt2");
  MemoryPlanRequest cuda = on_a_discrete_gpu(cpu_request(gpt2, "layup", 8, 1024));
  cuda.layup_clip = LayupClip::kDeferred;
  cuda.optimizer_placement = OptimizerPlacement::parse("device:2,staged:5");
  const RunMemory on_gpu = plan_run_memory(cuda);
  int staged = 0;
  for (int layer = 0; layer < gpt2.n_layer; ++layer) {
    const UpdateSite site = on_gpu.schedule.update_sites[1 + layer];
    if (layer < 2) {
      EXPECT_EQ(site, UpdateSite::kDevice);
    }
    staged += site == UpdateSite::kStaged;
  }
  EXPECT_EQ(staged, 5);
  cuda.optimizer_placement = OptimizerPlacement::parse("device:2");
  const MemoryPlan unstaged = plan_memory(cuda);
  const size_t block = ParameterLayout(gpt2).block().count * sizeof(float);
  EXPECT_EQ(on_gpu.plan.bytes(MemorySide::kDevice, TensorClass::kMasterWeights) -
                unstaged.bytes(MemorySide::kDevice, TensorClass::kMasterWeights),
            2 * ((block + 255) / 256 * 256));
}

// --streamed-blocks: a streamed block's compute weights leave the device for a ring of two
// block-sized slots (the plan lists it, and the CPU backend's accountant measures it as planned);
// auto streams the fewest blocks that let the device's side fit its budget, none where everything
// fits or where streaming cannot run; gpu mode and layup computing with a bf16 copy refuse a
// count.
TEST(MemoryPlan, StreamedBlocksTradeTheirDeviceWeightsForARing) {
  // The CPU backend: measured as planned.
  {
    const ModelConfig config = tiny_config();
    MemoryPlanRequest request = cpu_request(config, "layup", 2, 8);
    request.streamed_blocks = StreamedBlocks::parse("2");
    const RunMemory run = plan_run_memory(request, 1);
    EXPECT_EQ(run.schedule.streamed_blocks, 2);
    auto accountant = std::make_shared<MemoryAccountant>();
    const ParameterLayout layout(config);
    std::unique_ptr<Schedule> schedule =
        make_schedule(Mode::kLayup, make_cpu_backend(config, 2, 8, accountant),
                      make_cpu_device(accountant), layout, run.schedule);
    schedule->import_tensors(fresh_optimizer_tensors(layout, 7));
    ASSERT_TRUE(random_step(*schedule, config, 2, 8, 1, 1.0f).applied);
    const std::string report = format_memory_report(run.plan, *accountant);
    EXPECT_NE(report.find("every accounted cell matches the plan exactly"), std::string::npos)
        << report;
    bool ring = false;
    for (const PlannedAllocation& a : run.plan.allocations)
      ring |= a.what.find("weight ring: 2 slots") != std::string::npos;
    EXPECT_TRUE(ring);
    expect_one_step_plan(run);
  }
  // offload on a discrete GPU in fp32: N blocks' fp32 copies leave, two slots come.
  const ModelConfig config = named_config("gpt2");
  const size_t block = ParameterLayout(config).block().count * sizeof(float);
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "offload", 4, 256));
  request.dtype = Dtype::kFp32;
  request.streamed_blocks = StreamedBlocks::parse("0");
  const MemoryPlan resident = plan_memory(request);
  request.streamed_blocks = StreamedBlocks::parse("6");
  const MemoryPlan six = plan_memory(request);
  EXPECT_EQ(resident.bytes(MemorySide::kDevice) - six.bytes(MemorySide::kDevice), 4 * block);
  EXPECT_EQ(six.bytes(MemorySide::kHost), resident.bytes(MemorySide::kHost));
  // auto: none where everything fits; under a budget three blocks short, five (two slots back).
  request.streamed_blocks = {};
  EXPECT_EQ(resolve_optimizer_placement(request, {}).streamed_blocks.name(), "auto (0)");
  MemoryBudgets budgets;
  budgets.device = resident.bytes(MemorySide::kDevice) - 3 * block;
  const MemoryPlanRequest resolved = resolve_optimizer_placement(request, budgets);
  EXPECT_EQ(resolved.streamed_blocks.name(), "auto (5)");
  EXPECT_EQ(refusal(plan_memory(resolved), budgets), "");
  request.streamed_blocks = StreamedBlocks::parse("4");
  EXPECT_NE(refusal(plan_memory(request), budgets), "");
  // gpu mode has no host copy to stream from.
  request.mode = Mode::kGpu;
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("gpu mode"), std::string::npos);
  request.streamed_blocks = {};
  EXPECT_EQ(resolve_optimizer_placement(request, budgets).streamed_blocks.blocks(), 0);
  // layup in bf16, its host-updated weights landing in the backend's compute copy: a streamed
  // block's bf16 copy leaves the backend's weights region for a bf16 ring slot, and its bf16
  // weights wait in pinned host memory for their fills.
  request.mode = Mode::kLayup;
  request.dtype = Dtype::kBf16;
  request.layup_head = LayupHead::kHost;
  request.optimizer_placement = OptimizerPlacement::parse("host");
  request.streamed_blocks = StreamedBlocks::parse("0");
  const MemoryPlan bf16_resident = plan_memory(request);
  request.streamed_blocks = StreamedBlocks::parse("6");
  const RunMemory bf16_six = plan_run_memory(request);
  EXPECT_TRUE(bf16_six.schedule.weights_land_in_compute_copy);
  const size_t half = block / 2;  // one block's bf16 weights
  EXPECT_EQ(bf16_resident.bytes(MemorySide::kDevice) - bf16_six.plan.bytes(MemorySide::kDevice),
            4 * half);
  EXPECT_EQ(bf16_six.plan.bytes(MemorySide::kHost) - bf16_resident.bytes(MemorySide::kHost),
            6 * half);
  request.streamed_blocks = {};
  budgets.device = bf16_resident.bytes(MemorySide::kDevice) - 3 * half;
  EXPECT_EQ(resolve_optimizer_placement(request, budgets).streamed_blocks.name(), "auto (5)");
  // Llama 3 8B at B=4 on a 24 GiB device: the head placed on the device leaves no count that
  // fits; auto then moves the head to the host and streams the fewest blocks that fit.
  const MemoryPlanRequest llama = llama_3_8b_on_a_24_gib_board(4);
  MemoryBudgets board;
  board.device = size_t{24} << 30;
  const MemoryPlanRequest fitted = resolve_optimizer_placement(llama, board);
  const int fewest = fitted.streamed_blocks.blocks();
  EXPECT_GT(fewest, 0);
  EXPECT_EQ(fitted.layup_head, LayupHead::kHost);
  EXPECT_EQ(refusal(plan_memory(fitted), board), "");
  MemoryPlanRequest one_fewer = fitted;
  one_fewer.streamed_blocks = StreamedBlocks::parse(std::to_string(fewest - 1));
  EXPECT_NE(refusal(plan_memory(one_fewer), board), "");
  // Several ranks stream as one does, each rank from its own host copy.
  request = cpu_request(tiny_config(), "layup", 2, 8);
  request.streamed_blocks = StreamedBlocks::parse("2");
  request.ranks = 2;
  EXPECT_EQ(schedule_of(plan_memory(request)).streamed_blocks, 2);
  // The run's first line says what streams.
  request.ranks = 1;
  EXPECT_NE(describe_schedule(Mode::kLayup, schedule_of(plan_memory(request)), 0.0f)
                .find("the last 2 host-updated blocks' weights streamed to the device through a "
                      "ring of 2 slots"),
            std::string::npos);
  request.streamed_blocks = StreamedBlocks::parse("0");
  EXPECT_EQ(describe_schedule(Mode::kLayup, schedule_of(plan_memory(request)), 0.0f).find("stream"),
            std::string::npos);
  request.streamed_blocks = StreamedBlocks::parse("4");
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("--streamed-blocks 3 or fewer"),
            std::string::npos);
  EXPECT_THROW(StreamedBlocks::parse("-1"), Error);
  EXPECT_THROW(StreamedBlocks::parse("some"), Error);
}

// A 24 GiB device beside a 64 GiB host (a workstation): Llama 3 8B streams its blocks to fit the
// device, and the host cannot hold their state, so auto moves the fewest blocks to disk, streamed
// from a host copy of their weights; without a --offload-dir the budget check refuses.
TEST(MemoryPlan, AutoPutsStreamedBlocksOnDiskWhereTheHostIsShort) {
  MemoryPlanRequest llama = llama_3_8b_on_a_24_gib_board(2);
  llama.clip = 0.0f;
  llama.offload_dir = "/tmp";
  MemoryBudgets workstation;
  workstation.device = size_t{45} << 29;  // what --device-budget 24G leaves a plan (22.5 GiB)
  workstation.host = size_t{64} << 30;
  const MemoryPlanRequest fitted = resolve_optimizer_placement(llama, workstation);
  const int disk = fitted.optimizer_placement.blocks_on_disk();
  EXPECT_GT(disk, 0);
  EXPECT_LT(disk, 32);
  EXPECT_GT(fitted.streamed_blocks.blocks(), 0);
  EXPECT_EQ(refusal(plan_memory(fitted), workstation), "");
  // The fewest: one block less on disk does not fit the host.
  MemoryPlanRequest one_fewer = fitted;
  one_fewer.optimizer_placement.disk_blocks = disk - 1;
  EXPECT_NE(refusal(plan_memory(one_fewer), workstation), "");
  // The streamed disk blocks fill from a bf16 copy of their weights on the host.
  const RunMemory run = plan_run_memory(fitted);
  const std::vector<char> streamed = WeightRing::streamed_spans(
      ParameterLayout(fitted.config), run.schedule.update_sites, run.schedule.streamed_blocks);
  EXPECT_EQ(run.schedule.update_sites[32], UpdateSite::kDisk);
  EXPECT_TRUE(streamed[32]);
  // The same with the head's placement given: auto still takes the disk it needs.
  for (const LayupHead head : {LayupHead::kDevice, LayupHead::kHost}) {
    MemoryPlanRequest given = llama;
    given.layup_head = head;
    const MemoryPlanRequest placed = resolve_optimizer_placement(given, workstation);
    EXPECT_GT(placed.optimizer_placement.blocks_on_disk(), 0);
    EXPECT_EQ(refusal(plan_memory(placed), workstation), "")
        << (head == LayupHead::kHost ? "head on the host" : "head on the device");
  }
  llama.offload_dir.clear();
  EXPECT_EQ(resolve_optimizer_placement(llama, workstation).optimizer_placement.blocks_on_disk(),
            0);
}

// With a calibration, --layup-head and --streamed-blocks auto take the plan predicted fastest of
// those that fit, not the fewest streamed blocks: Llama 3 8B at B=2 x8 on a 24 GiB device, with an
// H100's rates, streams its blocks to make room for the head's state on the device, which takes
// the head's AdamW off the CPU, and no alternative that fits is predicted faster. Without rates
// the choice stays the memory-first one.
TEST(MemoryPlan, AutoTakesThePlanPredictedFastestWhereTheRatesAreKnown) {
  const MemoryPlanRequest llama = llama_3_8b_on_a_24_gib_board(2);
  MemoryBudgets board;
  board.device = size_t{24} << 30;
  MachineRates h100;
  h100.gpu_flops = 5.95e14;
  h100.gpu_block_flops = 5.19e14;
  h100.gpu_head_flops = 7.2e14;
  h100.h2d_bytes_per_s = 4.95e10;
  h100.d2h_bytes_per_s = 5.47e10;
  h100.cpu_adamw_params_per_s = 2.78e9;
  h100.cpu_adamw_alone_params_per_s = 4.27e9;
  h100.cpu_adamw_8bit_params_per_s = 2.5e9;
  h100.cpu_adamw_8bit_alone_params_per_s = 4.07e9;
  h100.host_add_floats_per_s = 8.18e9;
  h100.gpu_adamw_params_per_s = 1.04e11;
  h100.gpu_adamw_8bit_params_per_s = 6.56e10;
  const auto step_s = [&h100](const MemoryPlanRequest& request) {
    const RunMemory run = plan_run_memory(request);
    return predict_step_time(step_time_request(run.plan.request, run.step), h100).step_s;
  };
  const MemoryPlanRequest by_memory = resolve_optimizer_placement(llama, board);
  const MemoryPlanRequest by_time = resolve_optimizer_placement(llama, board, &h100);
  EXPECT_EQ(refusal(plan_memory(by_memory), board), "");
  EXPECT_EQ(refusal(plan_memory(by_time), board), "");
  EXPECT_EQ(by_time.layup_head, LayupHead::kDevice);
  EXPECT_GT(by_time.streamed_blocks.blocks(), by_memory.streamed_blocks.blocks());
  EXPECT_LT(step_s(by_time), 0.99 * step_s(by_memory));
  // A staged block may be streamed when asked, never by auto (its time is not yet predicted well).
  for (const SpanPlan& span : plan_run_memory(by_time).step.spans)
    EXPECT_FALSE(span.site == UpdateSite::kStaged && span.streamed);
  MemoryPlanRequest staged = llama;
  staged.optimizer_placement = OptimizerPlacement::parse("staged:8");
  staged.streamed_blocks = StreamedBlocks::parse("32");
  int staged_streamed = 0;
  for (const SpanPlan& span : plan_run_memory(staged).step.spans)
    staged_streamed += span.site == UpdateSite::kStaged && span.streamed;
  EXPECT_EQ(staged_streamed, 8);
  for (const LayupHead head : {LayupHead::kDevice, LayupHead::kHost})
    for (const int streamed : {0, 16, 32}) {
      MemoryPlanRequest other = llama;
      other.layup_head = head;
      other.optimizer_placement = OptimizerPlacement::parse("host");
      other.streamed_blocks = StreamedBlocks::parse(std::to_string(streamed));
      if (refusal(plan_memory(other), board).empty()) {
        EXPECT_LE(step_s(by_time), step_s(other))
            << "head " << static_cast<int>(head) << ", " << streamed << " streamed";
      }
    }
  // gpu mode has nothing to choose; a resolved request is not chosen again.
  MemoryPlanRequest gpu = llama;
  gpu.mode = Mode::kGpu;
  EXPECT_EQ(resolve_optimizer_placement(gpu, {}, &h100).streamed_blocks.blocks(), 0);
  EXPECT_EQ(resolve_optimizer_placement(by_time, board, &h100).streamed_blocks.blocks(),
            by_time.streamed_blocks.blocks());
}

// --optimizer-state: the plan counts each kind's bytes wherever the moments live (gpu mode's
// device buffer, layup's host, device and disk tiers), auto places blocks by them, and the planner
// never chooses a lossy kind itself: not under a budget that only a compact kind would fit.
TEST(MemoryPlan, CompactStateIsCountedInItsBytesAndNeverChosenUnasked) {
  const ModelConfig config = named_config("gpt2");
  const ParameterLayout layout(config);
  auto moments = [&](OptimizerStateKind kind) {
    size_t bytes = 0;
    for (const Span& span : layout.spans()) bytes += PackedMoments::padded_bytes(kind, span.count);
    return bytes;
  };
  for (const std::string mode : {"gpu", "layup"}) {
    SCOPED_TRACE(mode);
    MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, mode, 8, 1024));
    request.layup_clip = LayupClip::kDeferred;
    request.optimizer_placement = OptimizerPlacement::parse("host");
    for (const OptimizerStateKind kind : {OptimizerStateKind::kFp32, OptimizerStateKind::kBf16,
                                          OptimizerStateKind::kBlockwise8Bit}) {
      request.optimizer_state = kind;
      const MemoryPlan plan = plan_memory(request);
      EXPECT_EQ(plan.bytes(TensorClass::kOptimizerMoments), moments(kind)) << name_of(kind);
    }
  }
  EXPECT_EQ(moments(OptimizerStateKind::kFp32), 8 * layout.total_count());
  EXPECT_LT(moments(OptimizerStateKind::kBlockwise8Bit), 2.04 * layout.total_count());

  // auto against a device budget that holds four blocks' fp32 state places more blocks with 8-bit.
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 8, 1024));
  request.layup_clip = LayupClip::kDeferred;
  request.optimizer_placement = OptimizerPlacement::parse("device:4");
  MemoryBudgets budgets;
  budgets.device = plan_memory(request).bytes(MemorySide::kDevice);
  request.optimizer_placement = {};
  const int fp32_blocks =
      resolve_optimizer_placement(request, budgets).optimizer_placement.device_blocks;
  EXPECT_EQ(fp32_blocks, 4);
  request.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  const MemoryPlanRequest compact = resolve_optimizer_placement(request, budgets);
  EXPECT_GT(compact.optimizer_placement.device_blocks, fp32_blocks);
  EXPECT_EQ(compact.optimizer_state, OptimizerStateKind::kBlockwise8Bit);

  // The disk file shrinks to the kind's records.
  request.optimizer_state = OptimizerStateKind::kFp32;
  request.offload_dir = "/offload";
  request.optimizer_placement = OptimizerPlacement::parse("disk:6");
  const size_t fp32_disk = plan_memory(request).disk_bytes;
  request.optimizer_state = OptimizerStateKind::kBf16;
  EXPECT_LT(plan_memory(request).disk_bytes, fp32_disk * 2 / 3 + 6 * 2 * 4096);

  // A host budget fp32's state does not fit: the planner refuses (offering what it may, none of
  // it a lossy kind) and never resolves to one.
  request.optimizer_state = OptimizerStateKind::kFp32;
  request.offload_dir.clear();
  request.optimizer_placement = {};
  MemoryBudgets tight;
  tight.device = budgets.device;
  tight.host = plan_memory(request).bytes(MemorySide::kHost) / 2;
  const MemoryPlanRequest resolved = resolve_optimizer_placement(request, tight);
  EXPECT_EQ(resolved.optimizer_state, OptimizerStateKind::kFp32);
  const MemoryPlan plan = plan_memory(resolved);
  EXPECT_EQ(schedule_of(plan).optimizer_state, OptimizerStateKind::kFp32);
  for (const PlanAlternative& alternative : plan.alternatives)
    EXPECT_EQ(alternative.request.optimizer_state, OptimizerStateKind::kFp32) << alternative.flag;
  const std::string refused = refusal(plan, tight);
  EXPECT_NE(refused, "");
  EXPECT_EQ(refused.find("--optimizer-state"), std::string::npos) << refused;
}

// The disk tier: disk:D takes the last D blocks' master weights and moments off the host into a
// file (12 bytes a parameter, in the plan's disk_bytes) for a ring of staging slots; auto places as
// few there as the host's budget needs once the device is full; the disk's budget refuses what its
// free space cannot take, naming --offload-dir; the parser and the schedule's rules.
TEST(MemoryPlan, OptimizerPlacementUsesTheDiskWhenTheHostIsFull) {
  const ModelConfig config = named_config("gpt2");
  const ParameterLayout layout(config);
  const size_t block = layout.block().count * sizeof(float);
  MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, "layup", 8, 1024));
  request.layup_clip = LayupClip::kDeferred;
  request.offload_dir = "/offload";
  request.optimizer_placement = OptimizerPlacement::parse("device:2");
  const MemoryPlan host = plan_memory(request);
  EXPECT_EQ(host.disk_bytes, 0u);
  request.optimizer_placement = OptimizerPlacement::parse("device:2,disk:6");
  const MemoryPlan six = plan_memory(request);
  const ScheduleOptions options = schedule_of(six);
  for (int layer = 0; layer < config.n_layer; ++layer)
    EXPECT_EQ(options.update_sites[1 + layer], layer < 2   ? UpdateSite::kDevice
                                               : layer < 6 ? UpdateSite::kHost
                                                           : UpdateSite::kDisk)
        << "block " << layer;
  EXPECT_EQ(options.offload_dir, "/offload");
  EXPECT_GE(six.disk_bytes, 3 * 6 * block);
  EXPECT_LT(six.disk_bytes, 3 * 6 * block + 3 * 6 * 4096);  // each part padded to 4096 bytes
  // Off the host: six blocks' master weights and moments; on it: the staging slots (three blocks'
  // state, each padded for alignment). The accumulated gradient stays.
  const size_t slots = 3 * (3 * block + 3 * 4096);
  EXPECT_EQ(host.bytes(MemorySide::kHost, TensorClass::kMasterWeights) -
                six.bytes(MemorySide::kHost, TensorClass::kMasterWeights),
            6 * block);
  EXPECT_NEAR(static_cast<double>(host.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments)) -
                  static_cast<double>(six.bytes(MemorySide::kHost, TensorClass::kOptimizerMoments)),
              2.0 * 6 * block - slots, 4.0 * 4096 * 3);
  EXPECT_EQ(host.bytes(MemorySide::kHost, TensorClass::kWeightGrads),
            six.bytes(MemorySide::kHost, TensorClass::kWeightGrads));
  EXPECT_EQ(host.bytes(MemorySide::kDevice), six.bytes(MemorySide::kDevice));

  // auto, a device budget of two blocks and a host budget six disk blocks meet: two, then six.
  MemoryBudgets budgets;
  budgets.device = host.bytes(MemorySide::kDevice);
  budgets.host = six.bytes(MemorySide::kHost);
  request.optimizer_placement = {};
  const MemoryPlanRequest resolved = resolve_optimizer_placement(request, budgets);
  EXPECT_EQ(resolved.optimizer_placement.name(), "auto (device:2,disk:6)");
  EXPECT_EQ(refusal(plan_memory(resolved), budgets), "");
  // Without an --offload-dir auto uses no disk, and the plan is refused on the host's budget.
  request.offload_dir.clear();
  EXPECT_EQ(resolve_optimizer_placement(request, budgets).optimizer_placement.name(),
            "auto (device:2)");
  request.offload_dir = "/offload";
  // A disk too small for six blocks: refused, naming the directory's flag and the bytes.
  budgets.disk = six.disk_bytes - 1;
  budgets.disk_source = "/offload: a test's disk";
  request.optimizer_placement = OptimizerPlacement::parse("device:2,disk:6");
  const std::string full = refusal(plan_memory(request), budgets);
  EXPECT_NE(full.find("on disk for the optimizer state"), std::string::npos) << full;
  EXPECT_NE(full.find("--offload-dir"), std::string::npos) << full;
  EXPECT_NE(full.find("/offload: a test's disk"), std::string::npos) << full;
  // ... and auto finds nothing that fits both: it leaves the disk out.
  request.optimizer_placement = {};
  EXPECT_EQ(resolve_optimizer_placement(request, budgets).optimizer_placement.disk_blocks, 0);

  // The rules: a directory is needed; speculative clipping has no second copy on disk (auto
  // defers); other modes keep no state on disk; the blocks placed must exist.
  request.optimizer_placement = OptimizerPlacement::parse("disk:2");
  request.offload_dir.clear();
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("give --offload-dir"), std::string::npos);
  request.offload_dir = "/offload";
  request.layup_clip = LayupClip::kSpeculative;
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("--layup-clip deferred"),
            std::string::npos);
  request.layup_clip = LayupClip::kAuto;
  EXPECT_FALSE(schedule_of(plan_memory(request)).speculative_clip);
  request.optimizer_placement = OptimizerPlacement::parse("device:8,disk:5");
  EXPECT_NE(error_of([&] { plan_memory(request); }).find("places 13 blocks"), std::string::npos);
  MemoryPlanRequest gpu = request;
  gpu.mode = Mode::kGpu;
  gpu.optimizer_placement = OptimizerPlacement::parse("disk:1");
  EXPECT_NE(error_of([&] { plan_memory(gpu); }).find("gpu mode keeps all of it"),
            std::string::npos);
  EXPECT_EQ(OptimizerPlacement::parse("disk:3").name(), "disk:3");
  EXPECT_EQ(OptimizerPlacement::parse("device:1,disk:3"),
            OptimizerPlacement::parse("disk:3,device:1"));
  for (const char* bad : {"disk", "disk:", "disk:-1", "device:1,device:2", "device:1,", "disk:2x"})
    EXPECT_THROW(OptimizerPlacement::parse(bad), Error) << bad;
}

// ZeRO-1 on GPUs in every mode (--ranks 2): each rank plans its shard of the moments, where they
// lie (the device's in gpu mode and for layup's device-updated spans, the host's for the spans the
// CPU updates), beside bf16 weights landing in the compute copy.
TEST(MemoryPlan, OnGpusEveryModeSplitsTheMomentsAcrossTheRanks) {
  const ModelConfig config = gpt2_config(4, 2, 64, 64, 61);
  for (const char* mode : {"gpu", "offload", "layup"}) {
    SCOPED_TRACE(mode);
    MemoryPlanRequest request = on_a_discrete_gpu(cpu_request(config, mode, 2, 16, 2));
    request.layup_clip = LayupClip::kDeferred;
    const MemoryPlan one = plan_memory(request);
    request.ranks = 2;
    const RunMemory two = plan_run_memory(request);
    EXPECT_EQ(two.schedule.optimizer_shards, 2);
    EXPECT_EQ(two.schedule.weights_land_in_compute_copy, std::string(mode) == "layup");
    EXPECT_LT(two.plan.bytes(TensorClass::kOptimizerMoments),
              one.bytes(TensorClass::kOptimizerMoments));
    EXPECT_GE(2 * two.plan.bytes(TensorClass::kOptimizerMoments),
              one.bytes(TensorClass::kOptimizerMoments));
    for (const PlannedAllocation& buffer : two.plan.allocations) {
      if (buffer.tensor_class == TensorClass::kOptimizerMoments) {
        EXPECT_NE(buffer.what.find("this rank's shard of 2"), std::string::npos) << buffer.what;
      }
    }
  }
}

// ZeRO-1 with blocks on disk (--ranks 2): each rank's file holds its disk blocks' whole master
// weights and its part of their moments, and so do its staging slots; a plan lists the largest
// rank's (as it lists the largest shard of the host's moments). Blocks of a small vocabulary's
// model are most of it, so the shards cut them.
TEST(MemoryPlan, EachRankPlansItsPartOfTheDiskBlocksMoments) {
  const ModelConfig config = gpt2_config(4, 2, 64, 64, 61);
  const ParameterLayout layout(config);
  MemoryPlanRequest request = cpu_request(config, "layup", 2, 16, 2);
  request.layup_clip = LayupClip::kDeferred;
  request.offload_dir = "/offload";
  request.optimizer_placement = OptimizerPlacement::parse("disk:4");
  const MemoryPlan one = plan_memory(request);
  request.ranks = 2;
  const MemoryPlan two = plan_memory(request);
  const ScheduleOptions options = schedule_of(two);
  ASSERT_EQ(options.optimizer_shards, 2);
  const OptimizerShards shards = optimizer_shards(layout, 2);
  size_t largest_file = 0, largest_slot = 0;
  std::vector<size_t> moments(static_cast<size_t>(config.n_layer), 0);
  for (const int rank : {0, 1}) {
    const std::vector<DiskRecord> records =
        DiskTier::records(layout, options.update_sites, options.optimizer_state, &shards, rank);
    largest_file = std::max(largest_file, disk_state_bytes(records));
    largest_slot = std::max(largest_slot, disk_staging_ring(records, 1).slot_bytes);
    ASSERT_EQ(records.size(), moments.size());
    for (size_t block = 0; block < records.size(); ++block) {
      EXPECT_EQ(records[block].count, layout.block().count);
      moments[block] += records[block].moments();
    }
  }
  for (const size_t count : moments) EXPECT_EQ(count, layout.block().count);  // split, not lost
  EXPECT_EQ(two.disk_bytes, largest_file);
  // The weights whole (a third of one process's file), about half the moments.
  EXPECT_LT(two.disk_bytes, one.disk_bytes * 3 / 4);
  EXPECT_GT(two.disk_bytes, one.disk_bytes / 3);
  // The slots hold the largest record of any rank (here rank 0's block 0: its moments whole).
  size_t slots = 0;
  for (const PlannedAllocation& a : two.allocations)
    if (a.what.find("disk tier staging slot") != std::string::npos) slots += a.bytes;
  EXPECT_EQ(slots, static_cast<size_t>(options.disk_slots) * (largest_slot + kDiskAlignment));
}

}  // namespace
}  // namespace layup
