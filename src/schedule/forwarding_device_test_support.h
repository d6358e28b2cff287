// A Device that forwards every call to another: the base of the schedule tests' wrappers, which
// override only what they delay or watch, so a Device call added later reaches the inner device.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/device.h"

namespace layup {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::unique_ptr<Device> inner)
      : Device(inner->accountant()), inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  // Buffers come from the inner device, which also frees them.
  DeviceBuffer allocate_kind(size_t count, TensorClass c, MemorySide side,
                             MemoryKind kind) override {
    return inner_->allocate_kind(count, c, side, kind);
  }
  void release(float* data, MemoryKind kind) override { inner_->release(data, kind); }
  MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  MemoryKind host_memory_kind() const override { return inner_->host_memory_kind(); }
  void copy_to_device(float* dst, const float* src, size_t count) override {
    inner_->copy_to_device(dst, src, count);
  }
  void copy_to_host(float* dst, const float* src, size_t count) override {
    inner_->copy_to_host(dst, src, count);
  }
  std::shared_ptr<const DeviceFence> fence() override { return inner_->fence(); }
  void wait_for(const DeviceFence& fence) override { inner_->wait_for(fence); }
  void copy_to_host_after(const DeviceFence& after, float* dst, const float* src,
                          size_t count) override {
    inner_->copy_to_host_after(after, dst, src, count);
  }
  std::shared_ptr<const DeviceFence> copy_to_device_after(const DeviceFence* after, void* dst,
                                                          const void* src, size_t bytes) override {
    return inner_->copy_to_device_after(after, dst, src, bytes);
  }
  void copy_to_host_async(const DeviceFence& after, void* dst, const void* src, size_t bytes,
                          std::function<void()> landed) override {
    inner_->copy_to_host_async(after, dst, src, bytes, std::move(landed));
  }
  void order_after(const DeviceFence& fence) override { inner_->order_after(fence); }
  void copy_to_device_async(float* dst, const float* src, size_t count,
                            std::function<void()> landed) override {
    inner_->copy_to_device_async(dst, src, count, std::move(landed));
  }
  void copy_to_compute_copy_async(void* dst, const float* src, size_t count, float* staging,
                                  size_t staging_count, std::function<void()> landed) override {
    inner_->copy_to_compute_copy_async(dst, src, count, staging, staging_count, std::move(landed));
  }
  void cast_to_compute_copy(void* dst, const float* src, size_t count) override {
    inner_->cast_to_compute_copy(dst, src, count);
  }
  void fill_zero(float* dst, size_t count) override { inner_->fill_zero(dst, count); }
  void add(float* dst, const float* src, size_t count) override { inner_->add(dst, src, count); }
  double sum_of_squares(const float* x, size_t count) override {
    return inner_->sum_of_squares(x, count);
  }
  void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk, size_t end_chunk,
                             double* chunk_sums) override {
    inner_->chunk_sums_of_squares(x, count, first_chunk, end_chunk, chunk_sums);
  }
  void start_sum_of_squares(const float* x, size_t count, double* result) override {
    inner_->start_sum_of_squares(x, count, result);
  }
  void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                         const float* grads, float* m, float* v, const AdamWStep& step,
                         void* bf16_weights) override {
    inner_->adamw_update_span(layout, span, params, grads, m, v, step, bf16_weights);
  }
  std::vector<uint8_t> new_collectives_id() override { return inner_->new_collectives_id(); }
  std::unique_ptr<DeviceCollectives> join_collectives(const std::vector<uint8_t>& id, int rank,
                                                      int ranks) override {
    return inner_->join_collectives(id, rank, ranks);
  }
  void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                              size_t count, float* params, const float* grads, float* m, float* v,
                              const AdamWStep& step) override {
    inner_->adamw_update_span_part(layout, span, first, count, params, grads, m, v, step);
  }
  void adamw_update_span_state(const ParameterLayout& layout, const Span& span, float* params,
                               const float* grads, const AdamWMoments& moments,
                               const AdamWStep& step, void* bf16_weights) override {
    inner_->adamw_update_span_state(layout, span, params, grads, moments, step, bf16_weights);
  }
  void adamw_update_span_part_state(const ParameterLayout& layout, const Span& span, size_t first,
                                    size_t count, float* params, const float* grads,
                                    const AdamWMoments& moments, const AdamWStep& step,
                                    void* bf16_weights) override {
    inner_->adamw_update_span_part_state(layout, span, first, count, params, grads, moments, step,
                                         bf16_weights);
  }

 protected:
  Device& inner() const { return *inner_; }

 private:
  std::unique_ptr<Device> inner_;
};

}  // namespace layup
