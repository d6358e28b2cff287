// The step-time model's equations (docs/time_model.md) on made-up rates: what overlaps, what is
// exposed, and what bounds a step.
#include "engine/step_time_model.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/backend_factory.h"
#include "model/parameter_layout.h"

namespace layup {
namespace {

// Rates of a made-up machine, round numbers so the expected times are easy to check.
MachineRates rates() {
  MachineRates r;
  r.gpu_flops = 100e12;
  r.gpu_adamw_params_per_s = 100e9;
  r.cpu_adamw_params_per_s = 4e9;
  r.host_add_floats_per_s = 8e9;
  r.d2h_bytes_per_s = 50e9;
  r.h2d_bytes_per_s = 50e9;
  r.disk_read_bytes_per_s = 1.1e9;
  r.disk_write_bytes_per_s = 1.5e9;
  return r;
}

// Each span's update site: the blocks' (those from layer `disk_from` on: the disk), the head's.
std::vector<UpdateSite> sites(UpdateSite blocks, UpdateSite head, int disk_from = 12) {
  std::vector<UpdateSite> t(14, blocks);
  t.front() = t.back() = head;
  for (int l = disk_from; l < 12; ++l) t[1 + l] = UpdateSite::kDisk;
  return t;
}

// A request for GPT-2 small, its step planned as the schedule of `mode` with these update sites
// (layup; empty: every span on the host) runs it, clipping or not.
StepTimeRequest request(Mode mode, int micro_batches = 1, std::vector<UpdateSite> update_sites = {},
                        bool clipping = false,
                        Accumulation accumulation = Accumulation::kMicroBatchMajor) {
  StepTimeRequest r;
  r.config = gpt2_config(12, 12, 768, 1024);
  r.batch = 8;
  r.seq_len = 1024;
  ScheduleOptions options;
  options.update_sites = std::move(update_sites);
  options.accumulation = accumulation;
  r.plan = compile_step_plan(mode, ParameterLayout(r.config), options,
                             device_kinds_of(DeviceKind::kCuda), micro_batches, clipping);
  return r;
}

TEST(StepTimeModel, GpuModeIsTheFlopsAtTheRatePlusTheDevicesAdamW) {
  const StepTimeRequest r = request(Mode::kGpu);
  const StepTimePrediction p = predict_step_time(r, rates());
  const double tokens = 8.0 * 1024;
  EXPECT_NEAR(p.gpu_compute_s, tokens * model_flops_per_token(r.config, 1024) / 100e12, 1e-9);
  EXPECT_NEAR(p.gpu_adamw_s, ParameterLayout(r.config).total_count() / 100e9, 1e-9);
  EXPECT_NEAR(p.step_s, p.gpu_compute_s + p.gpu_adamw_s, 1e-12);
  EXPECT_EQ(p.bound_by, "GPU");
  EXPECT_EQ(p.exposed_s, 0.0);
}

TEST(StepTimeModel, TimesTheBlocksAndTheHeadEachAtItsOwnRateWhereCalibratedApart) {
  const StepTimeRequest r = request(Mode::kGpu);
  MachineRates m = rates();
  m.gpu_block_flops = 50e12;
  m.gpu_head_flops = 200e12;
  const double tokens = 8.0 * 1024, C = 768, V = r.config.vocab_size;
  const double head = 3.0 * 2.0 * V * C;  // forward and backward of the LM head
  const double blocks = model_flops_per_token(r.config, 1024) - head;
  EXPECT_NEAR(predict_step_time(r, m).gpu_compute_s, tokens * (blocks / 50e12 + head / 200e12),
              1e-9);
  // Only one of the two: the blended rate for both.
  m.gpu_head_flops.reset();
  EXPECT_NEAR(predict_step_time(r, m).gpu_compute_s,
              tokens * model_flops_per_token(r.config, 1024) / 100e12, 1e-9);
}

TEST(StepTimeModel, LayupWithEverySpanOnTheDevicePredictsLikeGpuMode) {
  const StepTimeRequest r =
      request(Mode::kLayup, 1, sites(UpdateSite::kDevice, UpdateSite::kDevice));
  const double gpu = predict_step_time(request(Mode::kGpu), rates()).step_s;
  EXPECT_NEAR(predict_step_time(r, rates()).step_s, gpu, 1e-9 * gpu);
}

TEST(StepTimeModel, ACpuSlowerThanTheBlocksBackwardIsExposed) {
  const StepTimeRequest r = request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice));
  MachineRates fast = rates(), slow = rates();
  fast.cpu_adamw_params_per_s = 1e12;
  slow.cpu_adamw_params_per_s = 0.2e9;
  const StepTimePrediction hidden = predict_step_time(r, fast);
  const StepTimePrediction exposed = predict_step_time(r, slow);
  // A fast CPU hides under the backward: only the last block's copy, update and weights back
  // (the drain) can show, as the next forward waits for block 0.
  EXPECT_EQ(hidden.bound_by, "GPU");
  EXPECT_LT(hidden.step_s, 1.02 * (hidden.gpu_compute_s + hidden.gpu_adamw_s));
  // A slow one: the step is at least the CPU's AdamW of every block, plus the forward of block 0.
  EXPECT_EQ(exposed.bound_by, "CPU (AdamW and gradient adds)");
  EXPECT_GT(exposed.exposed_s, 0.5 * exposed.cpu_adamw_s);
  EXPECT_GE(exposed.step_s, exposed.cpu_adamw_s);
  EXPECT_LT(exposed.step_s, exposed.cpu_adamw_s + exposed.gpu_compute_s + exposed.gpu_adamw_s);
}

TEST(StepTimeModel, DeferredUpdatesHideUnderTheNextForward) {
  const StepTimeRequest r =
      request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice), /*clipping=*/true);
  MachineRates m = rates();
  // The CPU's AdamW of all blocks about as long as the forward: it runs ahead of the forward,
  // block by block, so the step stays close to the GPU's own work.
  const StepTimePrediction gpu_only = predict_step_time(request(Mode::kGpu), m);
  const double forward_s = gpu_only.gpu_compute_s / 3.0;
  const double block_floats = ParameterLayout(r.config).block().count * 12.0;
  m.cpu_adamw_params_per_s = block_floats / (0.8 * forward_s);
  const StepTimePrediction p = predict_step_time(r, m);
  EXPECT_LT(p.step_s, p.gpu_compute_s + p.gpu_adamw_s + 0.5 * p.cpu_adamw_s);
  EXPECT_GT(p.step_s, p.gpu_compute_s + p.gpu_adamw_s);
}

TEST(StepTimeModel, AccumulationScalesTheComputeAndAddsOnTheHost) {
  const StepTimeRequest one =
      request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice));
  const StepTimeRequest four =
      request(Mode::kLayup, 4, sites(UpdateSite::kHost, UpdateSite::kDevice));
  const StepTimePrediction p1 = predict_step_time(one, rates());
  const StepTimePrediction p4 = predict_step_time(four, rates());
  EXPECT_NEAR(p4.gpu_compute_s, 4.0 * p1.gpu_compute_s, 1e-9);
  EXPECT_EQ(p1.host_add_s, 0.0);
  const double block_floats = ParameterLayout(one.config).block().count * 12.0;
  EXPECT_NEAR(p4.host_add_s, 3.0 * block_floats / 8e9, 1e-9);
  EXPECT_GT(p4.step_s, 3.5 * p1.step_s);
  // gpu mode too.
  EXPECT_NEAR(predict_step_time(request(Mode::kGpu, 4), rates()).gpu_compute_s,
              4.0 * predict_step_time(request(Mode::kGpu, 1), rates()).gpu_compute_s, 1e-9);
}

// Layer-major (docs/time_model.md): each block's gradient crosses the link once a step instead of
// once a micro-batch, the host adds only the head's, and every block's backward of a micro-batch
// moves three of its activations over the link.
TEST(StepTimeModel, LayerMajorCopiesEachBlockOnceAndMovesItsActivations) {
  const auto sites_on_host = sites(UpdateSite::kHost, UpdateSite::kHost);
  const StepTimeRequest micro_batch_major = request(Mode::kLayup, 4, sites_on_host);
  StepTimeRequest layer_major =
      request(Mode::kLayup, 4, sites_on_host, false, Accumulation::kLayerMajor);
  layer_major.activation_bytes = 2;
  const StepTimePrediction mb = predict_step_time(micro_batch_major, rates());
  const StepTimePrediction lm = predict_step_time(layer_major, rates());
  const double block_bytes = 4.0 * ParameterLayout(layer_major.config).block().count;
  EXPECT_NEAR(mb.spans[1].to_host_s, 4.0 * block_bytes / 50e9, 1e-9);
  EXPECT_NEAR(lm.spans[1].to_host_s, block_bytes / 50e9, 1e-9);
  EXPECT_EQ(lm.spans[1].add_s, 0.0);
  EXPECT_GT(lm.spans[0].add_s, 0.0) << "the host still sums the head's micro-batches";
  const double moved = 3.0 * 8 * 1024 * 768 * 2 / 50e9;  // B T C activations of 2 bytes, thrice
  EXPECT_NEAR(lm.spans[1].backward_s, mb.spans[1].backward_s + 4.0 * moved, 1e-9);
}

// N of the PaLM count is the matmul weights: GPT-2's 12 L C^2 + V C; in the Llama family every
// parameter but the norms' gains and, with an untied head, the input embedding.
// Streamed weights: each "weights in" task carries one block's compute weights (bf16 on CUDA) at
// the host-to-device rate, on the to-device lane beside the compute; a link slower than a block's
// forward exposes the fills.
TEST(StepTimeModel, StreamedBlocksFillTheirSlotsOverTheLink) {
  StepTimeRequest r = request(Mode::kLayup);
  r.activation_bytes = 2;
  const StepTimePrediction resident = predict_step_time(r, rates());
  ScheduleOptions options;
  options.streamed_blocks = 12;
  r.plan = compile_step_plan(Mode::kLayup, ParameterLayout(r.config), options,
                             device_kinds_of(DeviceKind::kCuda), 1, false);
  const int fills = r.plan.count(TaskKind::kWeightsIn, Lane::kToDevice);
  EXPECT_EQ(fills, 12 + 10);  // every forward; the backward less the last two read forward
  const double block = ParameterLayout(r.config).block().count;
  const StepTimePrediction streamed = predict_step_time(r, rates());
  // The host updates write the streamed blocks' new weights where the fills read them: no
  // "weights" task for them, and the fills on the link instead.
  EXPECT_NEAR(streamed.to_device_s - resident.to_device_s,
              fills * 2.0 * block / 50e9 - 12 * 4.0 * block / 50e9, 1e-9);
  EXPECT_NEAR(streamed.step_s, resident.step_s, 0.02 * resident.step_s) << "hidden at 50 GB/s";
  MachineRates slow = rates();
  slow.h2d_bytes_per_s = 0.5e9;
  EXPECT_GT(predict_step_time(r, slow).step_s, resident.step_s + 12 * 2.0 * block / 0.5e9);
}

TEST(StepTimeModel, FlopsPerTokenCountTheMatmulWeights) {
  EXPECT_DOUBLE_EQ(model_flops_per_token(gpt2_config(12, 12, 768, 1024), 1024),
                   6.0 * (12.0 * 12 * 768 * 768 + 50257.0 * 768) + 12.0 * 12 * 1024 * 768);
  for (const char* name : {"llama-3.2-1b", "llama-3-8b", "qwen2.5-0.5b"}) {
    const ModelConfig config = named_config(name);
    const double C = config.n_embd, L = config.n_layer;
    // The norms' gains and the q/k/v biases.
    const double vectors =
        (2.0 * L + 1.0) * C + (config.attention_bias ? L * config.qkv_width() : 0);
    const double input_embedding = config.tie_word_embeddings ? 0.0 : 1.0 * config.vocab_size * C;
    const double N = static_cast<double>(parameter_count(config)) - vectors - input_embedding;
    EXPECT_DOUBLE_EQ(model_flops_per_token(config, 2048), 6.0 * N + 12.0 * L * 2048 * C) << name;
  }
}

TEST(StepTimeModel, RecomputeThreeRunsTheBlocksForwardAgain) {
  StepTimeRequest r = request(Mode::kGpu);
  const double plain = predict_step_time(r, rates()).gpu_compute_s;
  r.recompute = 3;
  const double again = predict_step_time(r, rates()).gpu_compute_s;
  const double tokens = 8.0 * 1024;
  EXPECT_NEAR(again, tokens * executed_flops_per_token(r.config, 1024, 3) / 100e12, 1e-9);
  const double block_forward_flops = 24.0 * 768 * 768 + 4.0 * 1024 * 768;
  EXPECT_NEAR(again - plain, 12 * tokens * block_forward_flops / 100e12, 1e-9);
}

TEST(StepTimeModel, DiskSpansAreBoundByTheDisksRates) {
  const StepTimeRequest r =
      request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice, /*disk_from=*/6));
  const StepTimePrediction p = predict_step_time(r, rates());
  const double disk_floats = ParameterLayout(r.config).block().count * 6.0;
  EXPECT_NEAR(p.disk_read_s, 12.0 * disk_floats / 1.1e9, 1e-9);
  EXPECT_NEAR(p.disk_write_s, 12.0 * disk_floats / 1.5e9, 1e-9);
  EXPECT_GE(p.step_s, p.disk_read_s + p.disk_write_s);
  EXPECT_EQ(p.bound_by, "disk");
  EXPECT_GT(p.spans[7].disk_s, 0.0);
  EXPECT_EQ(p.spans[2].disk_s, 0.0);

  // A compact optimizer state kind moves its records' bytes: 8 a parameter with bf16 moments.
  StepTimeRequest bf16 = r;
  bf16.optimizer_state = OptimizerStateKind::kBf16;
  const StepTimePrediction q = predict_step_time(bf16, rates());
  EXPECT_NEAR(q.disk_read_s, 8.0 * disk_floats / 1.1e9, 1e-9);
  EXPECT_NEAR(q.disk_write_s, 8.0 * disk_floats / 1.5e9, 1e-9);
}

// Where the disk's rate with reads and writes at once was measured, both are timed by it: the
// step keeps them in flight together, and each alone overstates what the disk gives then.
TEST(StepTimeModel, DiskSpansUseTheMixedRateWhereMeasured) {
  const StepTimeRequest r =
      request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice, /*disk_from=*/6));
  MachineRates m = rates();
  const double apart = predict_step_time(r, m).step_s;
  m.disk_mixed_bytes_per_s = 0.8e9;
  const StepTimePrediction p = predict_step_time(r, m);
  const double disk_floats = ParameterLayout(r.config).block().count * 6.0;
  EXPECT_NEAR(p.disk_read_s, 12.0 * disk_floats / 0.8e9, 1e-9);
  EXPECT_NEAR(p.disk_write_s, 12.0 * disk_floats / 0.8e9, 1e-9);
  EXPECT_GE(p.step_s + 1e-9, p.disk_read_s + p.disk_write_s);  // the same sum, another order
  EXPECT_EQ(p.bound_by, "disk");
  EXPECT_GT(p.step_s, apart);
}

TEST(StepTimeModel, OffloadOverlapsNothingButTheWeightsGoingBack) {
  const StepTimeRequest r = request(Mode::kOffload);
  const StepTimePrediction p = predict_step_time(r, rates());
  const double serial = p.gpu_compute_s + p.to_host_s + p.cpu_adamw_s;
  EXPECT_GT(p.step_s, serial);
  EXPECT_LT(p.step_s, serial + p.to_device_s);
}

// Rates with the CPU's AdamW timed alone too: 4 G params/s beside copies, 6 alone.
MachineRates rates_with_adamw_alone(double alone = 6e9) {
  MachineRates m = rates();
  m.cpu_adamw_alone_params_per_s = alone;
  return m;
}

TEST(StepTimeModel, TheCpusAdamWRunsAloneButWhileTheCopiesBesideItRun) {
  const StepTimeRequest r = request(Mode::kOffload);
  const ParameterLayout layout(r.config);
  // Offload: beside each update only a span's weights going back (4 bytes a param at 50 GB/s);
  // for that long at 4 G params/s, the rest at 6.
  double expected = 0.0;
  for (const Span& span : layout.spans()) {
    const double n = static_cast<double>(span.count), beside = 4.0 * n / 50e9;
    expected += beside + (n - beside * 4e9) / 6e9;
  }
  const StepTimePrediction p = predict_step_time(r, rates_with_adamw_alone());
  EXPECT_NEAR(p.cpu_adamw_s, expected, 1e-12);
  const double all_beside = predict_step_time(r, rates()).cpu_adamw_s;
  EXPECT_NEAR(all_beside, layout.total_count() / 4e9, 1e-12);
  EXPECT_LT(p.cpu_adamw_s, all_beside);
  EXPECT_GT(p.cpu_adamw_s, layout.total_count() / 6e9);

  // Updating during backward, the next block's gradient comes down beside each update as well:
  // more of it runs beside copies than when deferred.
  const StepTimeRequest during = request(Mode::kLayup);
  const StepTimeRequest deferred = request(Mode::kLayup, 1, {}, /*clipping=*/true);
  const double during_s = predict_step_time(during, rates_with_adamw_alone()).cpu_adamw_s;
  const double deferred_s = predict_step_time(deferred, rates_with_adamw_alone()).cpu_adamw_s;
  EXPECT_NEAR(deferred_s, expected, 1e-12);
  EXPECT_GT(during_s, deferred_s);
  EXPECT_LT(during_s, all_beside);
}

TEST(StepTimeModel, ARateAloneNoFasterThanBesideCopiesChangesNothing) {
  const StepTimeRequest r = request(Mode::kLayup, 1, {}, /*clipping=*/true);
  const double beside = predict_step_time(r, rates()).step_s;
  EXPECT_NEAR(predict_step_time(r, rates_with_adamw_alone(4e9)).step_s, beside, 1e-12);
  // A noisy calibration that timed the AdamW alone slower than beside copies: the copies never
  // make it faster.
  EXPECT_NEAR(predict_step_time(r, rates_with_adamw_alone(3e9)).step_s, beside, 1e-12);
  // And a CPU that bounds the step is predicted faster where it runs faster alone.
  MachineRates slow = rates();
  slow.cpu_adamw_params_per_s = 0.5e9;
  MachineRates slow_beside_copies = slow;
  slow_beside_copies.cpu_adamw_alone_params_per_s = 1e9;
  const StepTimePrediction bound = predict_step_time(r, slow);
  ASSERT_EQ(bound.bound_by, "CPU (AdamW and gradient adds)");
  EXPECT_LT(predict_step_time(r, slow_beside_copies).step_s, bound.step_s);
}

TEST(StepTimeModel, SaysWhichRatesItLacks) {
  const StepTimeRequest r =
      request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice, /*disk_from=*/0));
  MachineRates m = rates();
  m.disk_read_bytes_per_s.reset();
  const std::vector<std::string> missing = missing_rates(r, m);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].find("--offload-dir"), std::string::npos);
  try {
    predict_step_time(r, m);
    FAIL() << "a missing disk rate was not refused";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("disk's read and write"), std::string::npos);
  }
  MachineRates gpu_only;
  gpu_only.gpu_flops = 1e12;
  gpu_only.gpu_adamw_params_per_s = 1e9;
  EXPECT_TRUE(missing_rates(request(Mode::kGpu), gpu_only).empty());
}

TEST(StepTimeModel, RefusesAPlanOfAnotherModel) {
  StepTimeRequest r = request(Mode::kLayup);
  r.config = gpt2_config(4, 12, 768, 1024);
  EXPECT_THROW(predict_step_time(r, rates()), Error);
}

TEST(StepTimeModel, FormatsTheParts) {
  const StepTimeRequest r = request(Mode::kLayup, 1, sites(UpdateSite::kHost, UpdateSite::kDevice));
  const std::string text = format_step_time(predict_step_time(r, rates()));
  EXPECT_NE(text.find("predicted step"), std::string::npos);
  EXPECT_NE(text.find("gradients to the host"), std::string::npos);
  EXPECT_NE(text.find("exposed"), std::string::npos);
}

TEST(StepTimeModel, TimesAdamWAtTheStateKindsOwnRateAndSaysWhereFp32sStandsIn) {
  const StepTimeRequest fp32 = request(Mode::kLayup);
  StepTimeRequest eight_bit = fp32;
  eight_bit.optimizer_state = OptimizerStateKind::kBlockwise8Bit;
  MachineRates m = rates();
  // Without an 8bit rate the fp32 one stands in, and the prediction says so.
  const StepTimePrediction stand_in = predict_step_time(eight_bit, m);
  EXPECT_DOUBLE_EQ(stand_in.cpu_adamw_s, predict_step_time(fp32, m).cpu_adamw_s);
  EXPECT_NE(format_step_time(stand_in).find("no 8bit rate"), std::string::npos)
      << format_step_time(stand_in);
  EXPECT_TRUE(predict_step_time(fp32, m).rates_note.empty());
  // With one, the CPU's AdamW takes twice as long at half the rate; fp32 runs are not touched.
  m.cpu_adamw_8bit_params_per_s = 2e9;
  m.gpu_adamw_8bit_params_per_s = 50e9;
  const StepTimePrediction own = predict_step_time(eight_bit, m);
  EXPECT_NEAR(own.cpu_adamw_s, 2.0 * predict_step_time(fp32, m).cpu_adamw_s, 1e-12);
  EXPECT_TRUE(own.rates_note.empty());
  EXPECT_DOUBLE_EQ(predict_step_time(fp32, m).cpu_adamw_s, stand_in.cpu_adamw_s);
}

}  // namespace
}  // namespace layup
