// DeviceTier: packed device buffers for the device-updated spans, and their AdamW.
#include "schedule/device_tier.h"

#include <vector>

#include "core/error.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

PackedMoments device_moments(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                             OptimizerStateKind kind) {
  return PackedMoments::of(kind, layout, [&](size_t index) {
    return index < sites.size() && sites[index] == UpdateSite::kDevice;
  });
}

}  // namespace

DeviceTier::Buffers DeviceTier::buffers(const ParameterLayout& layout,
                                        const std::vector<UpdateSite>& sites, MemoryKind grads_kind,
                                        DeviceKinds kinds, OptimizerStateKind kind) {
  const std::vector<Span>& all = layout.spans();
  LAYUP_CHECK(sites.empty() || sites.size() == all.size(), "the update sites name ", sites.size(),
              " spans, but the model has ", all.size(),
              " (the embeddings, one per block, the final norm)");
  size_t moments = 0, block_floats = 0, head_floats = 0;
  for (size_t index = 0; index < sites.size(); ++index) {
    if (sites[index] != UpdateSite::kDevice) continue;
    moments += all[index].count;
    (all[index].kind == SpanKind::kBlock ? block_floats : head_floats) += all[index].count;
  }
  Buffers buffers;
  const size_t f = sizeof(float);
  const MemorySide side = MemorySide::kDevice;
  if (moments == 0) return buffers;
  buffers.moments = {side, TensorClass::kOptimizerMoments, kinds.own,
                     device_moments(layout, sites, kind).bytes,
                     "AdamW m and v of the device-updated spans, " + name_of(kind)};
  if (block_floats > 0)
    buffers.block_grads = {side, TensorClass::kWeightGrads, grads_kind, block_floats * f,
                           "gradients of the device-updated blocks"};
  if (head_floats > 0)
    buffers.head_sums = {side, TensorClass::kWeightGrads, grads_kind, head_floats * f,
                         "the device-updated head spans' gradient summed over micro-batches "
                         "(allocated at the first step)"};
  return buffers;
}

BufferList DeviceTier::Buffers::list(bool several_micro_batches) const {
  BufferList list;
  for (const std::optional<PlannedAllocation>& buffer : {moments, block_grads})
    if (buffer) list.push_back(*buffer);
  if (head_sums && several_micro_batches) list.push_back(*head_sums);
  return list;
}

DeviceTier::DeviceTier(Device& device, const ParameterLayout& layout,
                       const std::vector<UpdateSite>& sites, MemoryKind grads_kind,
                       float* embeddings_grad, float* final_norm_grad, OptimizerStateKind kind)
    : device_(device),
      layout_(layout),
      buffers_(buffers(layout, sites, grads_kind, device.kinds(), kind)),
      moments_(device_moments(layout, sites, kind)),
      at_(layout.spans().size(), kNotHere),
      block_at_(layout.config().n_layer, kNotHere),
      head_sum_at_(layout.spans().size(), kNotHere),
      head_grads_{embeddings_grad, final_norm_grad} {
  const std::vector<Span>& all = layout.spans();
  size_t moments = 0, block_floats = 0;
  for (size_t index = 0; index < sites.size(); ++index) {
    if (sites[index] != UpdateSite::kDevice) continue;
    spans_.push_back(index);
    at_[index] = moments;
    moments += all[index].count;
    if (all[index].kind == SpanKind::kBlock) {
      block_at_[all[index].layer] = block_floats;
      block_floats += all[index].count;
    } else {
      head_sum_at_[index] = head_sum_count_;
      head_sum_count_ += all[index].count;
    }
  }
  if (buffers_.moments) moments_buffer_ = device.allocate(*buffers_.moments);
  if (buffers_.block_grads) block_grads_ = device.allocate(*buffers_.block_grads);
}

void DeviceTier::begin_step(size_t micro_batches) {
  summed_ = micro_batches > 1;
  if (summed_ && buffers_.head_sums && head_sums_.count() == 0)
    head_sums_ = device_.allocate(*buffers_.head_sums);
}

float* DeviceTier::block_gradient(int layer) const {
  LAYUP_CHECK(block_at_[layer] != kNotHere, "block ", layer, " is not updated on the device");
  return block_grads_.data() + block_at_[layer];
}

float* DeviceTier::own_gradient(size_t index) const {
  const Span& span = layout_.spans()[index];
  if (span.kind == SpanKind::kBlock) return block_gradient(span.layer);
  LAYUP_CHECK(head_sum_at_[index] != kNotHere && head_sums_.count() > 0, "span ", index,
              " has no sum over micro-batches on the device");
  return head_sums_.data() + head_sum_at_[index];
}

void DeviceTier::add(size_t index, const float* micro_batch, bool first) {
  float* sum = own_gradient(index);
  const size_t count = layout_.spans()[index].count;
  if (first) device_.fill_zero(sum, count);
  device_.add(sum, micro_batch, count);
}

float* DeviceTier::gradient(size_t index) const {
  const Span& span = layout_.spans()[index];
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  if (span.kind == SpanKind::kBlock || summed_) return own_gradient(index);
  return head_grads_[span.kind == SpanKind::kEmbeddings ? 0 : 1];
}

void DeviceTier::update(const AdamWStep& adamw, const std::vector<float*>& weights,
                        const std::vector<void*>& compute_copies, TraceRecorder* trace, int track) {
  for (const size_t index : spans_) {
    const Span& span = layout_.spans()[index];
    TraceSpan traced(trace, track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
    device_.adamw_update_span_state(layout_, span, weights[index], gradient(index),
                                    moments_.in(moments_buffer_.data(), index), adamw,
                                    compute_copies.empty() ? nullptr : compute_copies[index]);
  }
}

void DeviceTier::read_span(size_t index, const SpanState& out, const float* weights) const {
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  const size_t count = layout_.spans()[index].count;
  if (out.params) device_.copy_to_host(out.params, weights, count);
  const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
  if (out.coded != nullptr) {  // the buffer's layout of the span is the coded one
    device_.copy_to_host(static_cast<float*>(out.coded),
                         moments_.base(moments_buffer_.data(), index), moments_.floats(index));
    return;
  }
  if (moments.kind == OptimizerStateKind::kFp32) {
    if (out.m) device_.copy_to_host(out.m, moments.m_fp32(), count);
    if (out.v) device_.copy_to_host(out.v, moments.v_fp32(), count);
    return;
  }
  if (out.m == nullptr && out.v == nullptr) return;
  std::vector<float> coded(moments_.floats(index));
  device_.copy_to_host(coded.data(), moments_.base(moments_buffer_.data(), index), coded.size());
  decode_moments(AdamWMoments::in_buffer(moments.kind, coded.data(), count), count, out.m, out.v);
}

void DeviceTier::write_span(size_t index, const ConstSpanState& in) {
  LAYUP_CHECK(holds(index), "span ", index, " is not updated on the device");
  const size_t count = layout_.spans()[index].count;
  const AdamWMoments moments = moments_.in(moments_buffer_.data(), index);
  if (in.coded != nullptr) {
    device_.copy_to_device(moments_.base(moments_buffer_.data(), index),
                           static_cast<const float*>(in.coded), moments_.floats(index));
    return;
  }
  if (moments.kind == OptimizerStateKind::kFp32) {
    device_.copy_to_device(moments.m_fp32(), in.m, count);
    device_.copy_to_device(moments.v_fp32(), in.v, count);
    return;
  }
  // Coded from the span's first element, as its updates code it.
  std::vector<float> coded(moments_.floats(index));
  encode_moments(in.m, in.v, count, AdamWMoments::in_buffer(moments.kind, coded.data(), count));
  device_.copy_to_device(moments_.base(moments_buffer_.data(), index), coded.data(), coded.size());
}

}  // namespace layup
