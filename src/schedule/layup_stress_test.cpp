// The layup schedule under stress: 1000 steps of a tiny model on the CPU backend with random
// delays injected into the device thread (before every backend call and slot zeroing) and into the
// CPU side (before every copy out of device memory, fence wait and weight transfer, which the
// consumer and the coordinator make), compared with gpu mode's 1000 undelayed steps. Bit-for-bit
// equal losses, parameters and moments mean that no gradient slot was lost, read before its
// backward was done, or overwritten before the CPU had read it, whatever the timing. Run it under
// ThreadSanitizer too (LAYUP_SANITIZE=thread). The same delaying wrappers also poison a gradient
// on its way to the host, to check that a speculative step with a non-finite norm is undone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "schedule/forwarding_backend_test_support.h"
#include "schedule/forwarding_device_test_support.h"
#include "schedule/schedule.h"

namespace layup {
namespace {

// Races show in some interleavings only: ThreadSanitizer's build runs a thousand steps of random
// delays per case. AddressSanitizer finds no races; a fifth of the steps takes every case through
// the same code (docs/testing.md).
#if defined(__SANITIZE_ADDRESS__)
constexpr int kSteps = 200;
#else
constexpr int kSteps = 1000;
#endif
constexpr int kBatch = 2;
constexpr int kSeqLen = 4;

ModelConfig tiny_config() {
  return gpt2_config(4, 2, 16, 8, 37);
}

// A kBatch x kSeqLen batch of random token ids from `rng`, held in `inputs` and `targets`.
TokenBatch random_batch(std::mt19937& rng, int vocab_size, std::vector<int32_t>& inputs,
                        std::vector<int32_t>& targets) {
  inputs.resize(kBatch * kSeqLen);
  targets.resize(kBatch * kSeqLen);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int32_t>(rng() % vocab_size);
    targets[i] = static_cast<int32_t>(rng() % vocab_size);
  }
  return {inputs.data(), targets.data(), kBatch, kSeqLen};
}

// Sleeps for 0 to 50 microseconds, half the time not at all, from any thread.
class RandomDelays {
 public:
  explicit RandomDelays(unsigned seed) : rng_(seed) {}
  void maybe_sleep() {
    int micros = 0;
    {
      std::lock_guard lock(mutex_);
      micros = static_cast<int>(rng_() % 100) - 50;
    }
    if (micros > 0) std::this_thread::sleep_for(std::chrono::microseconds(micros));
  }

 private:
  std::mutex mutex_;
  std::mt19937 rng_;
};

// The CPU backend with a delay before each call (all made by the schedule's device thread).
class DelayingBackend final : public ForwardingBackend {
 public:
  DelayingBackend(std::unique_ptr<ModelBackend> inner, RandomDelays& delays)
      : ForwardingBackend(std::move(inner)), delays_(delays) {}
  float forward(const ParameterPointers& params, const TokenBatch& batch,
                ForwardHooks& hooks) override {
    delays_.maybe_sleep();
    return inner().forward(params, batch, hooks);
  }
  void backward_head(const ParameterPointers& params, float* final_norm_grad,
                     float* embeddings_grad, float loss_scale) override {
    delays_.maybe_sleep();
    inner().backward_head(params, final_norm_grad, embeddings_grad, loss_scale);
  }
  void backward_block(int layer, const ParameterPointers& params, float* block_grad) override {
    delays_.maybe_sleep();
    inner().backward_block(layer, params, block_grad);
    if (after_backward_block_) after_backward_block_(layer, block_grad);
    delays_.maybe_sleep();  // between the writes and the fence the schedule takes next
  }
  // Called with each block's gradient as its backward wrote it (a test may change it there). Set
  // it only while no step runs.
  void set_after_backward_block(std::function<void(int, float*)> hook) {
    after_backward_block_ = std::move(hook);
  }
  void backward_embeddings(const ParameterPointers& params, float* embeddings_grad) override {
    delays_.maybe_sleep();
    inner().backward_embeddings(params, embeddings_grad);
  }
  void park_micro_batch(void* store, bool with_inputs) override {
    delays_.maybe_sleep();
    inner().park_micro_batch(store, with_inputs);
  }
  void resume_micro_batch(const void* store, int layer) override {
    delays_.maybe_sleep();
    inner().resume_micro_batch(store, layer);
  }
  void forward_embeddings(const ParameterPointers& params, const TokenBatch& batch, void* hidden,
                          void* store, ForwardHooks& hooks) override {
    delays_.maybe_sleep();
    inner().forward_embeddings(params, batch, hidden, store, hooks);
  }
  void forward_block(int layer, const ParameterPointers& params, void* hidden, void* store,
                     ForwardHooks& hooks) override {
    delays_.maybe_sleep();
    inner().forward_block(layer, params, hidden, store, hooks);
  }
  float forward_head(const ParameterPointers& params, const TokenBatch& batch, const void* hidden,
                     ForwardHooks& hooks) override {
    delays_.maybe_sleep();
    return inner().forward_head(params, batch, hidden, hooks);
  }

 private:
  RandomDelays& delays_;
  std::function<void(int, float*)> after_backward_block_;
};

// The CPU device with a delay before each operation the schedules' threads use to hand data over.
class DelayingDevice final : public ForwardingDevice {
 public:
  DelayingDevice(std::unique_ptr<Device> inner, RandomDelays& delays)
      : ForwardingDevice(std::move(inner)), delays_(delays) {}
  DeviceBuffer allocate_kind(size_t count, TensorClass c, MemorySide side,
                             MemoryKind kind) override {
    // What it calls device memory is the inner device's host memory.
    if (claims_device_memory_ && kind == MemoryKind::kDevice) kind = inner().memory_kind();
    return inner().allocate_kind(count, c, side, kind);
  }
  // claim_device_memory: report device memory, which the host cannot read in place, so that a
  // schedule copies gradients out as on a discrete GPU (the CPU device's copies are memcpys).
  MemoryKind memory_kind() const override {
    return claims_device_memory_ ? MemoryKind::kDevice : inner().memory_kind();
  }
  void claim_device_memory() { claims_device_memory_ = true; }
  void wait_for(const DeviceFence& fence) override {
    delays_.maybe_sleep();
    inner().wait_for(fence);
  }
  void copy_to_host_after(const DeviceFence& after, float* dst, const float* src,
                          size_t count) override {
    delays_.maybe_sleep();
    if (count == slow_copy_count_ && before_slow_copy_) before_slow_copy_();
    inner().copy_to_host_after(after, dst, src, count);
  }
  // Runs `hook` on the copying thread before every copy out of device memory of `count` floats
  // (a test may hold such a copy back there). Set it only while no step runs.
  void set_before_copy_to_host(size_t count, std::function<void()> hook) {
    slow_copy_count_ = count;
    before_slow_copy_ = std::move(hook);
  }
  // The streamed blocks' fills (WeightRing) on the ring's thread.
  std::shared_ptr<const DeviceFence> copy_to_device_after(const DeviceFence* after, void* dst,
                                                          const void* src, size_t bytes) override {
    delays_.maybe_sleep();
    return inner().copy_to_device_after(after, dst, src, bytes);
  }
  void copy_to_device_async(float* dst, const float* src, size_t count,
                            std::function<void()> landed) override {
    delays_.maybe_sleep();
    ++transfers_to_device_;
    inner().copy_to_device_async(dst, src, count, std::move(landed));
  }
  void copy_to_compute_copy_async(void* dst, const float* src, size_t count, float* staging,
                                  size_t staging_count, std::function<void()> landed) override {
    delays_.maybe_sleep();
    ++transfers_to_device_;
    inner().copy_to_compute_copy_async(dst, src, count, staging, staging_count, std::move(landed));
  }
  int transfers_to_device() const { return transfers_to_device_; }
  void fill_zero(float* dst, size_t count) override {
    delays_.maybe_sleep();
    inner().fill_zero(dst, count);
  }
  // An update on the device thread (update_sites), in any optimizer state kind.
  void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                         const float* grads, float* m, float* v, const AdamWStep& step,
                         void* bf16_weights) override {
    delays_.maybe_sleep();
    inner().adamw_update_span(layout, span, params, grads, m, v, step, bf16_weights);
  }
  void adamw_update_span_state(const ParameterLayout& layout, const Span& span, float* params,
                               const float* grads, const AdamWMoments& moments,
                               const AdamWStep& step, void* bf16_weights) override {
    delays_.maybe_sleep();
    inner().adamw_update_span_state(layout, span, params, grads, moments, step, bf16_weights);
  }
  void adamw_update_span_part_state(const ParameterLayout& layout, const Span& span, size_t first,
                                    size_t count, float* params, const float* grads,
                                    const AdamWMoments& moments, const AdamWStep& step,
                                    void* bf16_weights) override {
    delays_.maybe_sleep();
    inner().adamw_update_span_part_state(layout, span, first, count, params, grads, moments, step,
                                         bf16_weights);
  }

 private:
  RandomDelays& delays_;
  std::atomic<int> transfers_to_device_{0};
  bool claims_device_memory_ = false;
  size_t slow_copy_count_ = 0;
  std::function<void()> before_slow_copy_;
};

struct Trained {
  std::vector<float> losses;
  OptimizerTensors state;
  int blocks_redone = 0;  // over all steps (speculative clipping)
};

enum class Clipping {
  kNone,
  kEveryThird,  // a threshold that always clips on every third step, none on the others
  // Every third step as above; on the others the last step's norm, which clips about every other
  // time and often only once the head's gradient is in (speculative clipping then redoes).
  kMixed,
};

// kSteps steps of `micro_batches` micro-batches each; the same data for every schedule.
Trained train(std::unique_ptr<Schedule> schedule, const ParameterLayout& layout, Clipping clipping,
              int micro_batches = 1) {
  schedule->import_tensors(fresh_optimizer_tensors(layout, 3));
  std::mt19937 rng(99);
  std::vector<std::vector<int32_t>> inputs(micro_batches), targets(micro_batches);
  std::vector<TokenBatch> batches(micro_batches);
  Trained trained;
  float last_norm = 1e6f;
  for (int step = 0; step < kSteps; ++step) {
    for (int k = 0; k < micro_batches; ++k)
      batches[k] = random_batch(rng, layout.config().vocab_size, inputs[k], targets[k]);
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-3f;
    settings.adamw.t = step + 1;
    settings.clip_max_norm = 0.0f;
    if (clipping != Clipping::kNone && step % 3 == 0) settings.clip_max_norm = 1e-3f;
    if (clipping == Clipping::kMixed && step % 3 != 0) settings.clip_max_norm = last_norm;
    const StepStats stats = schedule->step(batches, settings);
    EXPECT_TRUE(stats.applied) << "step " << step;
    trained.losses.push_back(stats.loss);
    last_norm = static_cast<float>(stats.grad_norm);
    trained.blocks_redone += stats.blocks_redone;
  }
  trained.state = schedule->export_tensors();
  return trained;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same(const Trained& expected, const Trained& got, const char* what) {
  EXPECT_TRUE(same_bits(expected.losses, got.losses)) << what << ": losses";
  EXPECT_TRUE(same_bits(expected.state.params, got.state.params)) << what << ": parameters";
  EXPECT_TRUE(same_bits(expected.state.adam_m, got.state.adam_m)) << what << ": m";
  EXPECT_TRUE(same_bits(expected.state.adam_v, got.state.adam_v)) << what << ": v";
}

TEST(LayupStress, DelayedStepsTrainLikeTheGpuMode) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  RandomDelays delays(2026);
  const auto delayed_layup = [&](const ScheduleOptions& options, bool discrete = false) {
    auto device = std::make_unique<DelayingDevice>(make_cpu_device(), delays);
    if (discrete) device->claim_device_memory();
    return make_schedule(
        Mode::kLayup,
        std::make_unique<DelayingBackend>(make_cpu_backend(config, kBatch, kSeqLen), delays),
        std::move(device), layout, options);
  };
  const auto gpu = [&] {
    return make_schedule(Mode::kGpu, make_cpu_backend(config, kBatch, kSeqLen), make_cpu_device(),
                         layout);
  };

  // The gpu mode's runs each case is compared with.
  const Trained every_third = train(gpu(), layout, Clipping::kEveryThird);
  const Trained mixed = train(gpu(), layout, Clipping::kMixed);

  // With the whole host gradient: clipping on some steps (updates overlap the next forward), the
  // others unclipped (updates overlap the backward).
  expect_same(every_third, train(delayed_layup({.cpu_workers = 2}), layout, Clipping::kEveryThird),
              "layup with a host gradient");
  // Speculative clipping: blocks updated during backward into the spare state, some steps'
  // updates redone, the spare state promoted while the updates of the head still run.
  const Trained speculative =
      train(delayed_layup({.cpu_workers = 2, .speculative_clip = true}), layout, Clipping::kMixed);
  expect_same(mixed, speculative, "layup, speculative clipping");
  EXPECT_GT(speculative.blocks_redone, 0) << "no step redid a speculative update";
  // Without one: each block updated straight from its slot, which goes back only after its AdamW;
  // or, where the host cannot read device memory, from the slot's landing buffer, which the next
  // copy into it waits for.
  const Trained unclipped = train(gpu(), layout, Clipping::kNone);
  expect_same(
      unclipped,
      train(delayed_layup({.cpu_workers = 2, .host_gradient = false}), layout, Clipping::kNone),
      "layup from the slots");
  expect_same(unclipped,
              train(delayed_layup({.cpu_workers = 2, .host_gradient = false}, /*discrete=*/true),
                    layout, Clipping::kNone),
              "layup from the landing buffers");
  // The head updated on the device (a discrete GPU's default), while the blocks' updates of the
  // same step run on the CPU: deferred and speculative clipping, and from the slots.
  expect_same(every_third,
              train(delayed_layup({.cpu_workers = 2, .update_sites = head_on_device(layout)},
                                  /*discrete=*/true),
                    layout, Clipping::kEveryThird),
              "layup, head on the device");
  expect_same(mixed,
              train(delayed_layup({.cpu_workers = 2,
                                   .speculative_clip = true,
                                   .update_sites = head_on_device(layout)},
                                  /*discrete=*/true),
                    layout, Clipping::kMixed),
              "layup, speculative clipping, head on the device");
  expect_same(
      unclipped,
      train(delayed_layup(
                {.cpu_workers = 2, .host_gradient = false, .update_sites = head_on_device(layout)},
                /*discrete=*/true),
            layout, Clipping::kNone),
      "layup from the landing buffers, head on the device");
  // Two micro-batches: the device sums the head's gradient while the host sums the blocks'.
  expect_same(train(gpu(), layout, Clipping::kEveryThird, 2),
              train(delayed_layup({.cpu_workers = 2, .update_sites = head_on_device(layout)},
                                  /*discrete=*/true),
                    layout, Clipping::kEveryThird, 2),
              "layup, head on the device, two micro-batches");
  // A block updated on the device too: its gradient kept there (with two micro-batches summed
  // there through a slot the device thread gives back itself) while the blocks around it go
  // through the slots to the CPU.
  std::vector<UpdateSite> block_1_and_head = head_on_device(layout);
  block_1_and_head[1 + 1] = UpdateSite::kDevice;
  const Trained mixed_two = train(gpu(), layout, Clipping::kMixed, 2);
  expect_same(
      mixed_two,
      train(delayed_layup(
                {.cpu_workers = 2, .speculative_clip = true, .update_sites = block_1_and_head},
                /*discrete=*/true),
            layout, Clipping::kMixed, 2),
      "layup, speculative clipping, block 1 and the head on the device, two micro-batches");
  // Layer-major accumulation: each block's two micro-batches in its two slots in turn (the second
  // waits for the host to take the block above out), block 1 summed on the device, the head too.
  ScheduleOptions layer_major{
      .cpu_workers = 2, .speculative_clip = true, .update_sites = block_1_and_head};
  layer_major.accumulation = Accumulation::kLayerMajor;
  expect_same(mixed_two,
              train(delayed_layup(layer_major, /*discrete=*/true), layout, Clipping::kMixed, 2),
              "layup, layer-major, speculative clipping, block 1 and the head on the device");
  // Streamed weights: blocks 0, 2 and 3 compute from a ring of two slots, each filled on the
  // ring's thread once the device has read the slot's last block, and, first in a step, once the
  // block's update of the step before (speculative, redone, its spare state promoted) has landed.
  ScheduleOptions streamed = layer_major;
  streamed.streamed_blocks = 3;
  expect_same(mixed_two,
              train(delayed_layup(streamed, /*discrete=*/true), layout, Clipping::kMixed, 2),
              "layup, streamed weights, layer-major, speculative clipping");
  std::vector<UpdateSite> block_1(layout.spans().size(), UpdateSite::kHost);
  block_1[1 + 1] = UpdateSite::kDevice;
  expect_same(
      unclipped,
      train(delayed_layup({.cpu_workers = 2, .host_gradient = false, .update_sites = block_1},
                          /*discrete=*/true),
            layout, Clipping::kNone),
      "layup from the landing buffers, block 1 on the device");
}

// A speculative step whose gradient norm turns out not finite while its loss is finite (block 0's
// gradient, the last block consumed, is poisoned as its backward writes it) changes nothing: blocks
// L-1 .. 1 were updated speculatively into the spare state, and their weights sent to the
// device; the current state is left as it was, and the device copy of those blocks is refreshed
// from it, so the next forward computes what it computed before the step.
TEST(LayupSpeculation, AStepWithANonFiniteNormChangesNothing) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  RandomDelays delays(11);
  std::mt19937 rng(5);
  std::vector<int32_t> inputs, targets;
  const TokenBatch batch = random_batch(rng, config.vocab_size, inputs, targets);
  for (const bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "weights in place" : "weights copied");
    auto device = std::make_unique<DelayingDevice>(make_cpu_device(), delays);
    DelayingDevice& delaying = *device;
    auto backend =
        std::make_unique<DelayingBackend>(make_cpu_backend(config, kBatch, kSeqLen), delays);
    DelayingBackend& poisoning = *backend;
    std::unique_ptr<Schedule> schedule =
        make_schedule(Mode::kLayup, std::move(backend), std::move(device), layout,
                      {.cpu_workers = 2, .weights_in_place = in_place, .speculative_clip = true});
    schedule->import_tensors(fresh_optimizer_tensors(layout, 3));
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-2f;
    settings.adamw.t = 1;
    settings.clip_max_norm = 1e6f;  // never clips: the next step speculates
    ASSERT_TRUE(schedule->step(std::span(&batch, 1), settings).applied);

    const OptimizerTensors before = schedule->export_tensors();
    const float loss_before = schedule->evaluate(batch);
    // Block 0, the last one backward reaches: the blocks above it are speculated on first.
    poisoning.set_after_backward_block([](int layer, float* grad) {
      if (layer == 0) grad[0] = std::numeric_limits<float>::quiet_NaN();
    });
    const int transfers_before = delaying.transfers_to_device();
    settings.adamw.t = 2;
    const StepStats stats = schedule->step(std::span(&batch, 1), settings);
    poisoning.set_after_backward_block({});
    EXPECT_TRUE(std::isfinite(stats.loss));
    EXPECT_FALSE(std::isfinite(stats.grad_norm));
    EXPECT_FALSE(stats.applied);
    if (!in_place) {  // the speculation did send weights, which the undo had to take back
      EXPECT_GE(delaying.transfers_to_device() - transfers_before, config.n_layer - 1);
    }

    const OptimizerTensors after = schedule->export_tensors();
    EXPECT_TRUE(same_bits(before.params, after.params));
    EXPECT_TRUE(same_bits(before.adam_m, after.adam_m));
    EXPECT_TRUE(same_bits(before.adam_v, after.adam_v));
    const float loss_after = schedule->evaluate(batch);
    EXPECT_EQ(std::memcmp(&loss_before, &loss_after, sizeof(float)), 0)
        << "the device computes with other weights than before the step: " << loss_before
        << " then " << loss_after;
  }
}

// A step clipped on every step (deferred clipping, one micro-batch) knows its norm once the device
// has taken the head's sums of squares, before the head's gradient (the embeddings', the largest
// span at GPT-2 sizes) has landed on the host: the blocks' updates start while it lands, and the
// head's follow it. Shown by holding the embeddings' gradient copy back until a block's new
// weights have started for the device (bounded: a schedule that waits for the landing first
// would otherwise never get there). The stress test above checks the values of such steps.
TEST(LayupHeadLanding, BlockUpdatesOfAClippedStepStartWhileTheHeadGradientLands) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  ASSERT_NE(layout.embeddings().count, layout.block().count);
  ASSERT_NE(layout.embeddings().count, layout.final_norm().count);
  RandomDelays delays(23);
  auto device = std::make_unique<DelayingDevice>(make_cpu_device(), delays);
  DelayingDevice& delaying = *device;
  std::unique_ptr<Schedule> schedule =
      make_schedule(Mode::kLayup, make_cpu_backend(config, kBatch, kSeqLen), std::move(device),
                    layout, {.cpu_workers = 2});
  schedule->import_tensors(fresh_optimizer_tensors(layout, 3));

  std::atomic<int> landings = 0, landings_after_a_block_update = 0;
  delaying.set_before_copy_to_host(layout.embeddings().count, [&] {
    const int transfers = delaying.transfers_to_device();
    ++landings;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (delaying.transfers_to_device() == transfers &&
           std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (delaying.transfers_to_device() > transfers) ++landings_after_a_block_update;
  });

  std::mt19937 rng(17);
  std::vector<int32_t> inputs, targets;
  constexpr int kClippedSteps = 3;
  for (int step = 0; step < kClippedSteps; ++step) {
    const TokenBatch batch = random_batch(rng, config.vocab_size, inputs, targets);
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-3f;
    settings.adamw.t = step + 1;
    settings.clip_max_norm = 1e-3f;  // always clips
    const StepStats stats = schedule->step(std::span(&batch, 1), settings);
    EXPECT_TRUE(stats.applied) << "step " << step;
    EXPECT_LT(stats.clip_factor, 1.0f) << "step " << step;
  }
  schedule->export_tensors();  // every update has landed
  delaying.set_before_copy_to_host(0, {});
  EXPECT_EQ(landings, kClippedSteps);
  EXPECT_EQ(landings_after_a_block_update, kClippedSteps)
      << "the block updates of a clipped step waited for the head's gradient to land";
}

// With the head updated on the device (ScheduleOptions::update_sites, head_on_device) its gradient
// never goes to the host: no copy of the embeddings' gradient over steps that clip and steps that
// do not, and its AdamW moments are device memory in the accountant, while the host still keeps its
// blocks' state. The stress test above checks the values.
TEST(LayupHeadOnDevice, TheHeadsGradientStaysOnTheDevice) {
  const ModelConfig config = tiny_config();
  const ParameterLayout layout(config);
  ASSERT_NE(layout.embeddings().count, layout.block().count);
  RandomDelays delays(31);
  auto accountant = std::make_shared<MemoryAccountant>();
  auto device = std::make_unique<DelayingDevice>(make_cpu_device(accountant), delays);
  device->claim_device_memory();
  DelayingDevice& delaying = *device;
  std::unique_ptr<Schedule> schedule =
      make_schedule(Mode::kLayup, make_cpu_backend(config, kBatch, kSeqLen), std::move(device),
                    layout, {.cpu_workers = 2, .update_sites = head_on_device(layout)});
  schedule->import_tensors(fresh_optimizer_tensors(layout, 3));
  const size_t head_bytes = (layout.embeddings().count + layout.final_norm().count) * sizeof(float);
  EXPECT_EQ(accountant->cell(MemorySide::kDevice, TensorClass::kOptimizerMoments, MemoryKind::kHost)
                .current,
            2 * head_bytes);

  std::atomic<int> head_copies = 0;
  delaying.set_before_copy_to_host(layout.embeddings().count, [&] { ++head_copies; });
  std::mt19937 rng(41);
  std::vector<int32_t> inputs, targets;
  const OptimizerTensors before = schedule->export_tensors();
  for (int step = 0; step < 4; ++step) {
    const TokenBatch batch = random_batch(rng, config.vocab_size, inputs, targets);
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-3f;
    settings.adamw.t = step + 1;
    settings.clip_max_norm = step % 2 == 0 ? 1e-3f : 0.0f;  // clipped, then not
    EXPECT_TRUE(schedule->step(std::span(&batch, 1), settings).applied) << "step " << step;
  }
  const OptimizerTensors after = schedule->export_tensors();
  delaying.set_before_copy_to_host(0, {});
  EXPECT_EQ(head_copies, 0) << "the embeddings' gradient was copied to the host";
  // The head was updated all the same (its exported state comes from the device).
  const size_t wte = layout.spans().front().offset;  // the embeddings span: wte first
  EXPECT_NE(before.params[wte], after.params[wte]);
  EXPECT_NE(before.adam_v[wte], after.adam_v[wte]);
}

}  // namespace
}  // namespace layup
