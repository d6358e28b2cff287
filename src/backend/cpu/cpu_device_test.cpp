// The CPU device's AdamW on optimizer state of each kind: the bits of optim/adamw_state.h's span
// updates, fp32 through the fp32 update, and the refusals (a bf16 weight copy, a part inside an
// 8-bit block).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"
#include "optim/adamw_state.h"

namespace layup {
namespace {

struct SpanState {
  std::vector<float> params, grads;
  std::vector<uint8_t> moments;
};

SpanState span_state(OptimizerStateKind kind, size_t count) {
  Rng rng(count);
  SpanState s{std::vector<float>(count), std::vector<float>(count),
              std::vector<uint8_t>(optimizer_moments_bytes(kind, count))};
  std::vector<float> m(count), v(count);
  for (size_t i = 0; i < count; ++i) {
    s.params[i] = 0.1f * rng.normal();
    s.grads[i] = 0.01f * rng.normal();
    m[i] = 0.001f * rng.normal();
    v[i] = m[i] * m[i];
  }
  encode_moments(m.data(), v.data(), count, AdamWMoments::in_buffer(kind, s.moments.data(), count));
  return s;
}

AdamWStep a_step() {
  AdamWStep step;
  step.hyper.lr = 3e-3f;
  step.t = 4;
  step.grad_scale = 0.7f;
  return step;
}

TEST(CpuDevice, AdamWOnEveryStateKindIsTheSpanUpdate) {
  const std::unique_ptr<Device> device = make_cpu_device();
  const ParameterLayout layout(gpt2_config(1, 2, 40, 8, 61));
  for (auto [kind, name] : kOptimizerStateKindNames) {
    for (const Span& span : layout.spans()) {
      SpanState got = span_state(kind, span.count), expected = got;
      device->adamw_update_span_state(layout, span, got.params.data(), got.grads.data(),
                                      AdamWMoments::in_buffer(kind, got.moments.data(), span.count),
                                      a_step(), nullptr);
      adamw_update_span(layout, span, expected.params.data(), expected.grads.data(),
                        AdamWMoments::in_buffer(kind, expected.moments.data(), span.count),
                        a_step());
      EXPECT_EQ(std::memcmp(got.params.data(), expected.params.data(), span.count * sizeof(float)),
                0)
          << name;
      EXPECT_EQ(got.moments, expected.moments) << name;
      if (kind == OptimizerStateKind::kFp32) {
        // The fp32 form of the call, on the same state, gives the same bits.
        SpanState plain = span_state(kind, span.count);
        const AdamWMoments moments =
            AdamWMoments::in_buffer(kind, plain.moments.data(), span.count);
        device->adamw_update_span(layout, span, plain.params.data(), plain.grads.data(),
                                  moments.m_fp32(), moments.v_fp32(), a_step(), nullptr);
        EXPECT_EQ(plain.moments, got.moments);
      }
    }
  }
}

TEST(CpuDevice, StatePartsAreTheFreeFunctionsAndStayInWholeBlocks) {
  const std::unique_ptr<Device> device = make_cpu_device();
  const ParameterLayout layout(gpt2_config(1, 2, 40, 8, 61));
  const Span& span = layout.spans()[1];
  const OptimizerStateKind kind = OptimizerStateKind::kBlockwise8Bit;
  const size_t first = kOptimizerStateBlock, count = span.count - first;
  SpanState got = span_state(kind, count), expected = got;
  device->adamw_update_span_part_state(
      layout, span, first, count, got.params.data(), got.grads.data(),
      AdamWMoments::in_buffer(kind, got.moments.data(), count), a_step(), nullptr);
  adamw_update_span_part(layout, span, first, count, expected.params.data(), expected.grads.data(),
                         AdamWMoments::in_buffer(kind, expected.moments.data(), count), a_step());
  EXPECT_EQ(got.moments, expected.moments);
  EXPECT_THROW(device->adamw_update_span_part_state(
                   layout, span, first + 1, count - 1, got.params.data(), got.grads.data(),
                   AdamWMoments::in_buffer(kind, got.moments.data(), count - 1), a_step(), nullptr),
               Error);
  int bf16_copy = 0;
  EXPECT_THROW(device->adamw_update_span_state(
                   layout, span, got.params.data(), got.grads.data(),
                   AdamWMoments::in_buffer(kind, got.moments.data(), count), a_step(), &bf16_copy),
               Error);
}

}  // namespace
}  // namespace layup
