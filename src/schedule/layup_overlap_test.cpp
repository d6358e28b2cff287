// The point of the `layup` schedule, measured: without clipping, the CPU's AdamW on block l runs
// while the device thread computes the backward of block l-1, and so with speculative clipping
// (docs/schedules.md, "Clipping") on a step that is not clipped. With deferred clipping no block
// is updated before the whole backward is done; the updates then run during the next step's
// forward, whose block l starts only once block l's update has landed. Read off
// traces of real steps of a small model on the CPU backend (the device work runs on its own
// thread there, so the overlap is real, not simulated).
//
// Why the timing checks are not flaky on a loaded 2-core machine: a block's backward takes
// milliseconds at these sizes (width 128, 256 tokens), while what the CPU does between the end
// of backward_block l and the start of "adamw block l" is a copy and an add of one block's
// gradient (~200k floats, a fraction of a millisecond); and a clipped step returns as soon as
// the norm is known, microseconds before the next forward starts, while its eight span updates
// take milliseconds. The checks ask only for at least half of the blocks, and each gets three
// attempts: one in which the scheduler kept a thread off a core for a long time is retried, not
// failed. The ordering checks (nothing is read before its update landed) hold whatever the
// timing and are made on every attempt.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "schedule/schedule.h"
#include "trace/trace_recorder.h"

namespace layup {
namespace {

constexpr int kLayers = 6;
constexpr int kBatch = 4;
constexpr int kSeqLen = 64;
constexpr int kCpuWorkers = 2;

ModelConfig overlap_config() {
  // Width 128 (a block: ~200k parameters, milliseconds of backward at 256 tokens) and a small
  // head (96 tokens), so that the blocks dominate the step.
  return gpt2_config(kLayers, 4, 128, kSeqLen, 96);
}

class LayupOverlap : public ::testing::Test {
 protected:
  LayupOverlap() : layout_(overlap_config()) {
    const ModelConfig config = overlap_config();
    fresh_ = fresh_optimizer_tensors(layout_, 11);
    rebuild({.cpu_workers = kCpuWorkers});

    std::mt19937 rng(5);
    inputs_.resize(kBatch * kSeqLen);
    targets_.resize(kBatch * kSeqLen);
    for (size_t i = 0; i < inputs_.size(); ++i) {
      inputs_[i] = static_cast<int32_t>(rng() % config.vocab_size);
      targets_[i] = static_cast<int32_t>(rng() % config.vocab_size);
    }
  }

  // A new schedule with these options, from the same start.
  void rebuild(const ScheduleOptions& options) {
    schedule_ = make_schedule(Mode::kLayup, make_cpu_backend(overlap_config(), kBatch, kSeqLen),
                              make_cpu_device(), layout_, options);
    schedule_->import_tensors(fresh_);
    updates_ = 0;
  }

  StepStats step(float clip_max_norm) {
    const TokenBatch batch{inputs_.data(), targets_.data(), kBatch, kSeqLen};
    UpdateSettings settings;
    settings.adamw.hyper.lr = 1e-3f;
    settings.adamw.t = ++updates_;
    settings.clip_max_norm = clip_max_norm;
    return schedule_->step(std::span(&batch, 1), settings);
  }

  // One step recorded into a fresh trace.
  std::unique_ptr<TraceRecorder> traced_step(float clip_max_norm) {
    auto trace = std::make_unique<TraceRecorder>();
    schedule_->set_trace(trace.get());
    EXPECT_TRUE(step(clip_max_norm).applied);
    schedule_->set_trace(nullptr);
    return trace;
  }

  void expect_updates_overlap_the_backward(float clip_max_norm);

  ParameterLayout layout_;
  OptimizerTensors fresh_;  // what schedule_ starts from
  std::unique_ptr<Schedule> schedule_;
  std::vector<int32_t> inputs_, targets_;
  int updates_ = 0;
};

// The spans of a trace by name ("backward_block 3"), with the name of the track they are on.
struct NamedSpan {
  std::string track;
  double start_us = 0.0, end_us = 0.0;
};

// A track of one HostAdamW worker ("cpu worker 3"): its spans repeat the names of the whole
// update's spans on "cpu workers" (TraceFileNamesTheTracks checks them), so the helpers below,
// which look spans up by name, leave them out.
bool on_one_workers_track(const TraceRecorder& trace, const TraceEvent& event) {
  return trace.track_name(event.track).rfind("cpu worker ", 0) == 0;
}

std::map<std::string, NamedSpan> spans_by_name(const TraceRecorder& trace) {
  std::map<std::string, NamedSpan> spans;
  for (const TraceEvent& event : trace.events()) {
    if (on_one_workers_track(trace, event)) continue;
    EXPECT_FALSE(spans.count(event.name)) << event.name << " recorded twice in one step";
    spans[event.name] = {trace.track_name(event.track), event.start_us, event.end_us};
  }
  return spans;
}

const NamedSpan& span(const std::map<std::string, NamedSpan>& spans, const std::string& name) {
  static const NamedSpan missing{"(missing)", 0.0, 0.0};
  const auto found = spans.find(name);
  EXPECT_NE(found, spans.end()) << "no span " << name;
  return found == spans.end() ? missing : found->second;
}

// "backward_block 3": a span name as the schedules write it.
std::string name_of(const char* what, int layer) {
  std::string name = what;
  name += ' ';
  name += std::to_string(layer);
  return name;
}

bool on_a_worker_track(const NamedSpan& s) {
  return s.track == "cpu workers";
}

// Every span of a trace by name, in start order: a name occurs once per step in a trace of
// several steps.
std::map<std::string, std::vector<NamedSpan>> spans_by_name_in_order(const TraceRecorder& trace) {
  std::map<std::string, std::vector<NamedSpan>> spans;
  for (const TraceEvent& event : trace.events())  // sorted by start time
    if (!on_one_workers_track(trace, event))
      spans[event.name].push_back({trace.track_name(event.track), event.start_us, event.end_us});
  return spans;
}

// The n-th span called `name` (0: the first step's).
const NamedSpan& nth(const std::map<std::string, std::vector<NamedSpan>>& spans,
                     const std::string& name, size_t n) {
  static const NamedSpan missing{"(missing)", 0.0, 0.0};
  const auto found = spans.find(name);
  const bool there = found != spans.end() && found->second.size() > n;
  EXPECT_TRUE(there) << "no span " << name << " #" << n;
  return there ? found->second[n] : missing;
}

// Spans every layup step has, on the right tracks, in the order causality demands.
void expect_complete_step(const std::map<std::string, NamedSpan>& spans) {
  for (const char* name : {"forward", "backward_head", "backward_embeddings"})
    EXPECT_EQ(span(spans, name).track, "GPU") << name;
  for (int l = 0; l < kLayers; ++l) {
    const NamedSpan& backward = span(spans, name_of("backward_block", l));
    const NamedSpan& consume = span(spans, name_of("consume block", l));
    const NamedSpan& adamw = span(spans, name_of("adamw block", l));
    EXPECT_EQ(backward.track, "GPU");
    EXPECT_EQ(span(spans, name_of("wait_slot", l)).track, "GPU");
    EXPECT_EQ(consume.track, "gradients to host");
    EXPECT_TRUE(on_a_worker_track(adamw)) << adamw.track;
    // A block's gradient is consumed after its backward, and updated after it is consumed.
    EXPECT_GE(consume.start_us, backward.end_us) << "block " << l;
    EXPECT_GE(adamw.start_us, consume.end_us) << "block " << l;
  }
  for (const char* name : {"adamw embeddings", "adamw final_norm"}) {
    EXPECT_TRUE(on_a_worker_track(span(spans, name))) << name;
    EXPECT_GE(span(spans, name).start_us, span(spans, "backward_embeddings").end_us) << name;
  }
}

// Blocks l in 1..L-1 whose AdamW started before the backward of block l-1 ended.
int blocks_updated_during_backward(const std::map<std::string, NamedSpan>& spans) {
  int overlapped = 0;
  for (int l = 1; l < kLayers; ++l) {
    overlapped += span(spans, name_of("adamw block", l)).start_us <
                  span(spans, name_of("backward_block", l - 1)).end_us;
  }
  return overlapped;
}

// Steps with this clip threshold until at least half of the L-1 = 5 blocks that can overlap did,
// or three traced steps have run; expects that they did.
void LayupOverlap::expect_updates_overlap_the_backward(float clip_max_norm) {
  step(clip_max_norm);  // untraced: first-touch page faults and thread start-up stay out of it
  constexpr int kAttempts = 3;
  constexpr int kNeeded = kLayers / 2;
  int best = -1;
  for (int attempt = 0; attempt < kAttempts && best < kNeeded; ++attempt) {
    const std::unique_ptr<TraceRecorder> trace = traced_step(clip_max_norm);
    const std::map<std::string, NamedSpan> spans = spans_by_name(*trace);
    expect_complete_step(spans);
    best = std::max(best, blocks_updated_during_backward(spans));
  }
  EXPECT_GE(best, kNeeded) << "in the best of " << kAttempts << " steps only " << best << " of "
                           << kLayers - 1
                           << " block updates started before the backward of the block below "
                              "them ended: the CPU updates do not overlap the backward";
}

TEST_F(LayupOverlap, WithoutClippingBlockUpdatesOverlapTheBackward) {
  expect_updates_overlap_the_backward(0.0f);
}

// Speculative clipping (design (b), the trainer's default): a step whose norm stays under the
// threshold updates its blocks during backward, as without clipping.
TEST_F(LayupOverlap, WithSpeculativeClippingBlockUpdatesOverlapTheBackward) {
  rebuild({.cpu_workers = kCpuWorkers, .speculative_clip = true});
  expect_updates_overlap_the_backward(1e6f);
}

TEST_F(LayupOverlap, WithClippingEveryUpdateWaitsForTheWholeBackward) {
  // Deferred clipping (docs/schedules.md, "Clipping"): the global norm is known only after the
  // last backward, so no block may be updated before it. This holds whatever the timing.
  const std::unique_ptr<TraceRecorder> trace = traced_step(1e6f);
  const std::map<std::string, NamedSpan> spans = spans_by_name(*trace);
  expect_complete_step(spans);
  const double backward_done_us = span(spans, "backward_embeddings").end_us;
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_GE(span(spans, name_of("adamw block", l)).start_us, backward_done_us)
        << "block " << l << " was updated before the gradient norm was known";
  }
}

TEST_F(LayupOverlap, WithClippingBlockUpdatesOverlapTheNextForward) {
  // Exact clipping, design (a): a step returns once the global norm is known, and its updates run
  // in forward order while the next step's forward runs; that forward reads block l only after
  // block l's update has landed in the device copy (the "forward block l" span starts when its
  // wait for the update is over).
  step(1e6f);  // untraced: first-touch page faults and thread start-up stay out of the timing
  constexpr int kAttempts = 3;
  constexpr int kNeeded = kLayers / 2;
  int best = -1;
  for (int attempt = 0; attempt < kAttempts && best < kNeeded; ++attempt) {
    TraceRecorder trace;
    schedule_->set_trace(&trace);
    EXPECT_TRUE(step(1e6f).applied);
    EXPECT_TRUE(step(1e6f).applied);
    schedule_->set_trace(nullptr);  // waits for the second step's updates
    const auto spans = spans_by_name_in_order(trace);

    // Order, whatever the timing: every span of the second forward starts after the first step's
    // update of that span ended, and no update starts before the first step's backward is done.
    const double backward_done_us = nth(spans, "backward_embeddings", 0).end_us;
    const NamedSpan& next_forward = nth(spans, "forward", 1);
    const auto expect_read_after_update = [&](const std::string& part, const std::string& update) {
      const NamedSpan& read = nth(spans, "forward " + part, 1);
      const NamedSpan& updated = nth(spans, "adamw " + update, 0);
      const NamedSpan& landed = nth(spans, "weights " + update, 0);
      EXPECT_EQ(read.track, "GPU") << part;
      EXPECT_TRUE(on_a_worker_track(updated)) << update << " on " << updated.track;
      EXPECT_EQ(landed.track, "to device") << update;
      EXPECT_GE(updated.start_us, backward_done_us) << update << " ran before the norm was known";
      EXPECT_GE(landed.start_us, updated.end_us) << update << " sent before it was updated";
      EXPECT_GE(read.start_us, landed.end_us)
          << "the next forward read " << part << " before its new weights had landed";
      EXPECT_GE(read.start_us, next_forward.start_us) << part;
      EXPECT_LE(read.end_us, next_forward.end_us) << part;
    };
    expect_read_after_update("embeddings", "embeddings");
    for (int l = 0; l < kLayers; ++l)
      expect_read_after_update(name_of("block", l), name_of("block", l));
    expect_read_after_update("head", "final_norm");

    // Overlap: block updates still running when the next forward had started.
    int overlapped = 0;
    for (int l = 0; l < kLayers; ++l)
      overlapped += nth(spans, name_of("adamw block", l), 0).end_us > next_forward.start_us;
    best = std::max(best, overlapped);
  }
  EXPECT_GE(best, kNeeded) << "in the best of " << kAttempts << " step pairs only " << best
                           << " of " << kLayers
                           << " block updates of a clipped step were still running when the next "
                              "forward started: the updates do not overlap the next forward";
}

// A clipped step returns before its updates have landed; whatever reads the parameters next must
// still see all of them: evaluate and forward_logits (span by span, through the forward's hooks)
// and export_tensors (all at once) agree bit for bit with the `gpu` mode after the same step.
TEST_F(LayupOverlap, ReadsRightAfterAClippedStepSeeItsUpdates) {
  const ModelConfig config = overlap_config();
  std::unique_ptr<Schedule> gpu = make_schedule(
      Mode::kGpu, make_cpu_backend(config, kBatch, kSeqLen), make_cpu_device(), layout_);
  gpu->import_tensors(fresh_);
  const TokenBatch batch{inputs_.data(), targets_.data(), kBatch, kSeqLen};
  UpdateSettings settings;
  settings.adamw.hyper.lr = 1e-3f;
  settings.clip_max_norm = 1e-3f;  // always clips
  for (int t = 1; t <= 2; ++t) {
    settings.adamw.t = t;
    const StepStats expected = gpu->step(std::span(&batch, 1), settings);
    const StepStats got = schedule_->step(std::span(&batch, 1), settings);
    EXPECT_LT(got.clip_factor, 1.0f);
    EXPECT_EQ(got.loss, expected.loss) << "step " << t;
    EXPECT_EQ(got.grad_norm, expected.grad_norm) << "step " << t;
    if (t == 1) {
      EXPECT_EQ(schedule_->evaluate(batch), gpu->evaluate(batch));
    } else {
      const size_t count = static_cast<size_t>(kBatch) * kSeqLen * config.padded_vocab_size;
      const float* logits = schedule_->forward_logits(batch);
      const std::vector<float> got_logits(logits, logits + count);
      const float* gpu_logits = gpu->forward_logits(batch);
      EXPECT_EQ(got_logits, std::vector<float>(gpu_logits, gpu_logits + count));
    }
  }
  settings.adamw.t = 3;
  schedule_->step(std::span(&batch, 1), settings);
  gpu->step(std::span(&batch, 1), settings);
  const OptimizerTensors got = schedule_->export_tensors();
  const OptimizerTensors expected = gpu->export_tensors();
  EXPECT_EQ(got.params, expected.params);
  EXPECT_EQ(got.adam_m, expected.adam_m);
  EXPECT_EQ(got.adam_v, expected.adam_v);
}

TEST_F(LayupOverlap, TraceFileNamesTheTracks) {
  const std::unique_ptr<TraceRecorder> trace = traced_step(0.0f);
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("layup_overlap_trace_" + std::to_string(getpid()) + ".json");
  trace->write(path.string());
  std::ifstream in(path);
  const nlohmann::json parsed = nlohmann::json::parse(in);
  std::filesystem::remove(path);

  std::map<int, std::string> track_names;
  std::set<std::string> span_tracks;
  for (const nlohmann::json& event : parsed.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name")
      track_names[event.at("tid").get<int>()] = event.at("args").at("name");
  }
  for (const nlohmann::json& event : parsed.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    EXPECT_GE(event.at("dur").get<double>(), 0.0);
    span_tracks.insert(track_names.at(event.at("tid").get<int>()));
  }
  // Every track is named, whether or not its worker happened to get a task in this step.
  std::set<std::string> named;
  for (const auto& [tid, name] : track_names) named.insert(name);
  std::set<std::string> expected_tracks = {"GPU", "gradients to host", "cpu workers", "to device"};
  for (int worker = 0; worker < kCpuWorkers; ++worker)
    expected_tracks.insert("cpu worker " + std::to_string(worker));
  EXPECT_EQ(named, expected_tracks);
  EXPECT_TRUE(span_tracks.count("GPU"));
  EXPECT_TRUE(span_tracks.count("cpu workers"));
  EXPECT_TRUE(span_tracks.count("to device"));  // each span's new weights on their way
  // Each worker's share of the AdamWs, on that worker's track.
  for (int worker = 0; worker < kCpuWorkers; ++worker)
    EXPECT_TRUE(span_tracks.count("cpu worker " + std::to_string(worker))) << worker;
}

}  // namespace
}  // namespace layup
