// Pins HostAdamW to adamw_update / adamw_update_span bit for bit whatever the worker count, its
// statistics, its first-touch split, and that pinning which fails or is turned off changes
// nothing but the status.
#include "optim/host_adamw.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"
#include "optim/adamw_state.h"

namespace layup {
namespace {

struct State {
  std::vector<float> params, grads, m, v;
};

State random_state(size_t count, uint64_t seed) {
  Rng rng(seed);
  State s{std::vector<float>(count), std::vector<float>(count), std::vector<float>(count),
          std::vector<float>(count)};
  for (size_t i = 0; i < count; ++i) {
    s.params[i] = 0.1f * rng.normal();
    s.grads[i] = 0.01f * rng.normal();
    s.m[i] = 0.001f * rng.normal();
    const float root = 0.001f * rng.normal();
    s.v[i] = root * root;
  }
  return s;
}

AdamWStep step_number(int k) {
  AdamWStep step;
  step.hyper = {2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  step.t = 1 + k;
  step.grad_scale = 0.6f;
  return step;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same_bits(const State& got, const State& expected, const std::string& where) {
  EXPECT_TRUE(same_bits(got.params, expected.params)) << "params differ: " << where;
  EXPECT_TRUE(same_bits(got.m, expected.m)) << "m differs: " << where;
  EXPECT_TRUE(same_bits(got.v, expected.v)) << "v differs: " << where;
}

// A small model whose width (40) is not a multiple of 16, so tensors start off cache lines.
ParameterLayout small_layout() {
  return ParameterLayout(gpt2_config(2, 2, 40, 8, 61));
}

// Three steps over every span with the engine and with adamw_update_span, compared after each.
void expect_spans_match(HostAdamW& engine, const std::string& what) {
  const ParameterLayout layout = small_layout();
  const size_t n = layout.total_count();
  State got = random_state(n, 5), expected = got;
  for (int k = 0; k < 3; ++k) {
    const AdamWStep step = step_number(k);
    for (const Span& span : layout.spans()) {
      const size_t at = span.offset;
      engine.update_span(layout, span, got.params.data() + at, got.grads.data() + at,
                         got.m.data() + at, got.v.data() + at, step);
      adamw_update_span(layout, span, expected.params.data() + at, expected.grads.data() + at,
                        expected.m.data() + at, expected.v.data() + at, step);
    }
    expect_same_bits(got, expected, what + ", step " + std::to_string(k));
  }
}

TEST(HostAdamW, SpanUpdatesMatchAdamWUpdateSpanForAnyWorkerCount) {
  for (int workers : {1, 2, 3, 7}) {
    HostAdamWOptions options;
    options.workers = workers;
    HostAdamW engine(options);
    ASSERT_EQ(engine.worker_count(), workers);
    expect_spans_match(engine, std::to_string(workers) + " workers");
  }
}

// A model's fp32 weights and gradients with AdamW moments in `kind`, coded from random ones.
struct CompactState {
  std::vector<float> params, grads;
  std::vector<uint8_t> moments;  // each span's in optim/adamw_moments.h's one-buffer layout
  std::vector<size_t> at;        // where each span's moments start in `moments`
};

CompactState compact_state(const ParameterLayout& layout, OptimizerStateKind kind, uint64_t seed) {
  const State fp32 = random_state(layout.total_count(), seed);
  CompactState s{fp32.params, fp32.grads, {}, {}};
  for (const Span& span : layout.spans()) {
    s.at.push_back(s.moments.size());
    s.moments.resize(s.moments.size() +
                     ((optimizer_moments_bytes(kind, span.count) + 3) & ~size_t{3}));
  }
  for (size_t i = 0; i < layout.spans().size(); ++i) {
    const Span& span = layout.spans()[i];
    encode_moments(fp32.m.data() + span.offset, fp32.v.data() + span.offset, span.count,
                   AdamWMoments::in_buffer(kind, s.moments.data() + s.at[i], span.count));
  }
  return s;
}

// bf16 and 8-bit state: any worker count gives the bits of adamw_update_span (whose loops run the
// span in one share, or OpenMP's), in place and out of place, and every block stays whole.
TEST(HostAdamW, StateKindsMatchTheSpanUpdateForAnyWorkerCount) {
  const ParameterLayout layout = small_layout();
  for (OptimizerStateKind kind : {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    for (int workers : {1, 3, 7}) {
      HostAdamWOptions options;
      options.workers = workers;
      HostAdamW engine(options);
      CompactState got = compact_state(layout, kind, 5), expected = got;
      for (int k = 0; k < 3; ++k) {
        const AdamWStep step = step_number(k);
        for (size_t i = 0; i < layout.spans().size(); ++i) {
          const Span& span = layout.spans()[i];
          const auto moments = [&](CompactState& s) {
            return AdamWMoments::in_buffer(kind, s.moments.data() + s.at[i], span.count);
          };
          float* params = got.params.data() + span.offset;
          const float* grads = got.grads.data() + span.offset;
          if (k == 1) {
            // Out of place, into a copy of the span's state, then back.
            CompactState out = got;
            engine.update_span(
                layout, span,
                {params, grads, moments(got), out.params.data() + span.offset, moments(out)}, step);
            got = out;
          } else {
            engine.update_span(layout, span,
                               AdamWStateBuffers::in_place(params, grads, moments(got)), step);
          }
          adamw_update_span(layout, span, expected.params.data() + span.offset,
                            expected.grads.data() + span.offset, moments(expected), step);
        }
        const std::string where =
            name_of(kind) + ", " + std::to_string(workers) + " workers, step " + std::to_string(k);
        EXPECT_TRUE(same_bits(got.params, expected.params)) << where;
        EXPECT_TRUE(got.moments == expected.moments) << where;
      }
      EXPECT_EQ(engine.params_updated(), 3 * static_cast<int64_t>(layout.total_count()));
    }
  }
}

// ZeRO-1's parts: a span updated in parts cut at 8-bit blocks (the last one at the span's end),
// each part's moments coded on their own from its first element, gives the whole span's bits.
TEST(HostAdamW, PartsOfASpanMatchTheWholeSpanInEveryKind) {
  const ParameterLayout layout = small_layout();
  const Span& block = layout.spans()[1];
  const std::vector<size_t> cuts = {0, kOptimizerStateBlock, 5 * kOptimizerStateBlock, block.count};
  ASSERT_LT(cuts[2], block.count);
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  for (OptimizerStateKind kind :
       {OptimizerStateKind::kFp32, OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    const State start = random_state(block.count, 9);
    const auto moments_of = [&](std::vector<uint8_t>& buffer, size_t first, size_t count) {
      buffer.assign(optimizer_moments_padded_bytes(kind, count), 0);
      const AdamWMoments moments = AdamWMoments::in_buffer(kind, buffer.data(), count);
      encode_moments(start.m.data() + first, start.v.data() + first, count, moments);
      return moments;
    };
    std::vector<uint8_t> whole_buffer;
    const AdamWMoments whole = moments_of(whole_buffer, 0, block.count);
    std::vector<float> expected = start.params, got = start.params;
    engine.update_span(layout, block,
                       AdamWStateBuffers::in_place(expected.data(), start.grads.data(), whole),
                       step_number(0));
    std::vector<float> expected_m(block.count), expected_v(block.count);
    decode_moments(whole, block.count, expected_m.data(), expected_v.data());
    std::vector<float> got_m(block.count), got_v(block.count);
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      const size_t first = cuts[p], count = cuts[p + 1] - cuts[p];
      std::vector<uint8_t> buffer;
      const AdamWMoments part = moments_of(buffer, first, count);
      engine.update_span_part(
          layout, block, first, count,
          AdamWStateBuffers::in_place(got.data() + first, start.grads.data() + first, part),
          step_number(0));
      decode_moments(part, count, got_m.data() + first, got_v.data() + first);
    }
    EXPECT_TRUE(same_bits(got, expected)) << name_of(kind);
    EXPECT_TRUE(same_bits(got_m, expected_m)) << name_of(kind);
    EXPECT_TRUE(same_bits(got_v, expected_v)) << name_of(kind);
  }
  // In 8-bit state a part must start a block.
  std::vector<float> params(block.count), grads(block.count);
  std::vector<uint8_t> buffer(
      optimizer_moments_padded_bytes(OptimizerStateKind::kBlockwise8Bit, 8));
  EXPECT_THROW(
      engine.update_span_part(
          layout, block, 3, 8,
          AdamWStateBuffers::in_place(
              params.data(), grads.data(),
              AdamWMoments::in_buffer(OptimizerStateKind::kBlockwise8Bit, buffer.data(), 8)),
          step_number(0)),
      Error);
}

TEST(HostAdamW, StateKindsRawUpdatesMatchTheLoop) {
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  for (OptimizerStateKind kind : {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
    const size_t count = 10 * kOptimizerStateBlock + 17;
    State fp32 = random_state(count, 3);
    std::vector<uint8_t> got(optimizer_moments_bytes(kind, count));
    encode_moments(fp32.m.data(), fp32.v.data(), count,
                   AdamWMoments::in_buffer(kind, got.data(), count));
    std::vector<uint8_t> expected = got;
    std::vector<float> params = fp32.params, expected_params = fp32.params;
    const DecayRun decay[] = {{count, true}};
    engine.update(AdamWStateBuffers::in_place(params.data(), fp32.grads.data(),
                                              AdamWMoments::in_buffer(kind, got.data(), count)),
                  count, step_number(0), true);
    adamw_update_state(
        AdamWStateBuffers::in_place(expected_params.data(), fp32.grads.data(),
                                    AdamWMoments::in_buffer(kind, expected.data(), count)),
        count, step_number(0), decay);
    EXPECT_TRUE(same_bits(params, expected_params)) << name_of(kind);
    EXPECT_TRUE(got == expected) << name_of(kind);
  }
}

// The share hook sees every worker start and then end its share, on that worker's own thread,
// and changes nothing in the update.
TEST(HostAdamW, ShareHookSeesEachWorkerStartAndEnd) {
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  const ParameterLayout layout = small_layout();
  const Span& span = layout.spans()[1];
  State got = random_state(layout.total_count(), 9), expected = got;
  std::vector<int> starts(3, 0), ends(3, 0);
  std::vector<std::thread::id> threads(3);
  const HostAdamW::ShareHook hook = [&](int worker, bool started) {
    if (started) {
      EXPECT_EQ(ends[worker], 0) << "worker " << worker << " ended before it started";
      ++starts[worker];
      threads[worker] = std::this_thread::get_id();
    } else {
      ++ends[worker];
      EXPECT_EQ(threads[worker], std::this_thread::get_id());
    }
  };
  const size_t at = span.offset;
  engine.update_span(layout, span, got.params.data() + at, got.grads.data() + at, got.m.data() + at,
                     got.v.data() + at, step_number(0), hook);
  adamw_update_span(layout, span, expected.params.data() + at, expected.grads.data() + at,
                    expected.m.data() + at, expected.v.data() + at, step_number(0));
  expect_same_bits(got, expected, "with a share hook");
  EXPECT_EQ(starts, std::vector<int>(3, 1));
  EXPECT_EQ(ends, std::vector<int>(3, 1));
  for (const std::thread::id& thread : threads) EXPECT_NE(thread, std::this_thread::get_id());
}

TEST(HostAdamW, RawUpdatesMatchAdamWUpdateOnOddSizes) {
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, size_t{1000003}}) {
    for (bool decay : {false, true}) {
      State got = random_state(count, 9 + count), expected = got;
      for (int k = 0; k < 3; ++k) {
        const AdamWStep step = step_number(k);
        engine.update(got.params.data(), got.grads.data(), got.m.data(), got.v.data(), count, step,
                      decay);
        adamw_update(expected.params.data(), expected.grads.data(), expected.m.data(),
                     expected.v.data(), count, step, decay);
      }
      expect_same_bits(got, expected,
                       "count " + std::to_string(count) + ", decay " + std::to_string(decay));
    }
  }
}

TEST(HostAdamW, EveryIsaGivesTheSameBits) {
  const size_t count = 100003;
  State reference = random_state(count, 21);
  adamw_update(reference.params.data(), reference.grads.data(), reference.m.data(),
               reference.v.data(), count, step_number(0), true);
  for (AdamWIsa isa : available_adamw_isas()) {
    HostAdamWOptions options;
    options.workers = 2;
    options.isa = isa;
    HostAdamW engine(options);
    EXPECT_EQ(engine.isa(), isa);
    State got = random_state(count, 21);
    engine.update(got.params.data(), got.grads.data(), got.m.data(), got.v.data(), count,
                  step_number(0), true);
    expect_same_bits(got, reference, adamw_isa_name(isa));
  }
}

TEST(HostAdamW, StatisticsCountTheParameters) {
  HostAdamWOptions options;
  options.workers = 2;
  HostAdamW engine(options);
  EXPECT_EQ(engine.rate_params_per_s(), 0.0);
  EXPECT_NE(engine.report().find("no updates yet"), std::string::npos) << engine.report();

  const size_t count = 200000;
  State s = random_state(count, 3);
  engine.update(s.params.data(), s.grads.data(), s.m.data(), s.v.data(), count, step_number(0),
                true);
  engine.update(s.params.data(), s.grads.data(), s.m.data(), s.v.data(), count, step_number(1),
                false);
  const ParameterLayout layout = small_layout();
  const Span& block = layout.spans()[1];
  State b = random_state(block.count, 4);
  engine.update_span(layout, block, b.params.data(), b.grads.data(), b.m.data(), b.v.data(),
                     step_number(0));

  EXPECT_EQ(engine.updates(), 3);
  EXPECT_EQ(engine.params_updated(), static_cast<int64_t>(2 * count + block.count));
  EXPECT_GT(engine.seconds(), 0.0);
  EXPECT_NEAR(engine.rate_params_per_s(), engine.params_updated() / engine.seconds(), 1e-6);
  const std::string report = engine.report();
  EXPECT_NE(report.find("CPU AdamW: 2 workers"), std::string::npos) << report;
  EXPECT_NE(report.find(adamw_isa_name(engine.isa())), std::string::npos) << report;
  EXPECT_NE(report.find("G params/s over 3 updates"), std::string::npos) << report;

  engine.reset_statistics();
  EXPECT_EQ(engine.updates(), 0);
  EXPECT_EQ(engine.params_updated(), 0);
}

TEST(HostAdamW, PinningTurnedOffOrOnChangesOnlyTheStatus) {
  HostAdamWOptions options;
  options.workers = 2;
  options.pin = false;
  HostAdamW unpinned(options);
  EXPECT_FALSE(unpinned.pinned());
  EXPECT_NE(unpinned.pin_status().find("turned off"), std::string::npos) << unpinned.pin_status();
  expect_spans_match(unpinned, "unpinned");

  options.pin = true;
  options.workers = 0;  // one per allowed core: every worker can have a core of its own
  HostAdamW pinned(options);
  EXPECT_GE(pinned.worker_count(), 1);
  // A container may forbid setting affinity; then the engine says so and runs unpinned.
  if (pinned.pinned()) {
    EXPECT_EQ(pinned.pin_status().rfind("pinned to cores ", 0), 0u) << pinned.pin_status();
  } else {
    EXPECT_EQ(pinned.pin_status().rfind("not pinned: ", 0), 0u) << pinned.pin_status();
  }
  expect_spans_match(pinned, "pinned");
}

TEST(HostAdamW, PinningThatFailsLeavesTheWorkersUnpinnedAndWorking) {
  HostAdamWOptions options;
  options.workers = 2;
  options.cores = {CPU_SETSIZE - 1};  // a core no machine running the tests has
  HostAdamW engine(options);
  EXPECT_FALSE(engine.pinned());
  EXPECT_EQ(engine.pin_status().rfind("not pinned: ", 0), 0u) << engine.pin_status();
  EXPECT_NE(engine.pin_status().find("failed"), std::string::npos) << engine.pin_status();
  expect_spans_match(engine, "after a failed pin");

  options.cores = {-1};
  HostAdamW outside(options);
  EXPECT_FALSE(outside.pinned());
  EXPECT_NE(outside.pin_status().find("outside"), std::string::npos) << outside.pin_status();
}

TEST(HostAdamW, WorkerSharesCoverEveryElementOnce) {
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  const size_t count = 1000003;
  std::vector<int> touched(count, 0);
  engine.for_each_worker_share(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) ++touched[i];
  });
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(touched[i], 1) << i;
  EXPECT_EQ(engine.updates(), 0);  // touching is not an update

  EXPECT_THROW(engine.for_each_worker_share(
                   count, [](size_t, size_t) { throw std::runtime_error("task failed"); }),
               std::runtime_error);
  // The engine still works after a task threw.
  expect_spans_match(engine, "after a throwing task");
}

TEST(HostAdamW, RunOnWorkersRunsTheTaskOncePerWorker) {
  HostAdamWOptions options;
  options.workers = 3;
  HostAdamW engine(options);
  std::vector<int> runs(3, 0);
  std::vector<std::thread::id> threads(3);
  engine.run_on_workers([&](int worker, int workers) {
    EXPECT_EQ(workers, 3);
    ++runs[worker];
    threads[worker] = std::this_thread::get_id();
  });
  EXPECT_EQ(runs, (std::vector<int>{1, 1, 1}));
  EXPECT_NE(threads[0], threads[1]);
  EXPECT_NE(threads[1], threads[2]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
  EXPECT_EQ(engine.updates(), 0);
  EXPECT_THROW(engine.run_on_workers([](int worker, int) {
    if (worker == 1) fail("worker 1 failed");
  }),
               Error);
  expect_spans_match(engine, "after a failed run_on_workers");
  EXPECT_GE(allowed_core_count(), 1);
}

TEST(HostAdamW, CallsFromSeveralThreadsAreSerialized) {
  HostAdamWOptions options;
  options.workers = 2;
  HostAdamW engine(options);
  constexpr int kCallers = 4;
  constexpr size_t kCount = 10007;
  std::vector<State> got, expected;
  for (int c = 0; c < kCallers; ++c) {
    got.push_back(random_state(kCount, 100 + c));
    expected.push_back(got.back());
  }
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int k = 0; k < 20; ++k)
        engine.update(got[c].params.data(), got[c].grads.data(), got[c].m.data(), got[c].v.data(),
                      kCount, step_number(k), true);
    });
  }
  for (std::thread& caller : callers) caller.join();
  for (int c = 0; c < kCallers; ++c) {
    for (int k = 0; k < 20; ++k)
      adamw_update(expected[c].params.data(), expected[c].grads.data(), expected[c].m.data(),
                   expected[c].v.data(), kCount, step_number(k), true);
    expect_same_bits(got[c], expected[c], "caller " + std::to_string(c));
  }
  EXPECT_EQ(engine.updates(), kCallers * 20);
}

TEST(HostAdamW, BadOptionsThrow) {
  HostAdamWOptions options;
  options.workers = -1;
  EXPECT_THROW(HostAdamW{options}, Error);
  options.workers = 1;
  // A level this CPU cannot run.
  options.isa = adamw_isa_available(AdamWIsa::kNeon) ? AdamWIsa::kAvx2 : AdamWIsa::kNeon;
  EXPECT_THROW(HostAdamW{options}, Error);
}

}  // namespace
}  // namespace layup
