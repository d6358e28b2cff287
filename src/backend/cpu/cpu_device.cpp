// The CPU backend's device: host memory and the host optimizer loops.
#include <cstring>
#include <new>

#include "backend/device.h"
#include "core/error.h"
#include "memory/parallel_pages.h"
#include "optim/grad_norm.h"

namespace layup {

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(std::shared_ptr<MemoryAccountant> accountant)
      : Device(std::move(accountant)) {}

  std::string name() const override { return "cpu"; }
  MemoryKind memory_kind() const override { return MemoryKind::kHost; }
  MemoryKind host_memory_kind() const override { return MemoryKind::kHost; }

  DeviceBuffer allocate_kind(size_t count, TensorClass tensor_class, MemorySide side,
                             MemoryKind kind) override {
    LAYUP_CHECK(kind == MemoryKind::kHost, "the CPU backend has only host memory, not ",
                memory_kind_name(kind), " memory for the ", tensor_class_label(tensor_class));
    return DeviceBuffer(this, zeroed_floats(count), count, record(count, tensor_class, side, kind),
                        kind);
  }

  void release(float* data, MemoryKind) override {
    ::operator delete[](data, std::align_val_t(64));
  }

  void copy_to_device(float* dst, const float* src, size_t count) override {
    std::memcpy(dst, src, count * sizeof(float));
  }
  void copy_to_host(float* dst, const float* src, size_t count) override {
    std::memcpy(dst, src, count * sizeof(float));
  }
  // The backend's work is done when its calls return: every fence has passed.
  std::shared_ptr<const DeviceFence> fence() override { return passed_; }
  void wait_for(const DeviceFence&) override {}
  void copy_to_host_after(const DeviceFence&, float* dst, const float* src, size_t count) override {
    copy_to_host(dst, src, count);
  }
  void copy_to_device_async(float* dst, const float* src, size_t count,
                            std::function<void()> landed) override {
    copy_to_device(dst, src, count);
    landed();
  }

  void copy_to_compute_copy_async(void*, const float*, size_t, float*, size_t,
                                  std::function<void()>) override {
    LAYUP_CHECK(false, "the CPU device computes in fp32 and keeps no bf16 copy of the weights");
  }
  void cast_to_compute_copy(void*, const float*, size_t) override {
    LAYUP_CHECK(false, "the CPU device computes in fp32 and keeps no bf16 copy of the weights");
  }

  void fill_zero(float* dst, size_t count) override { std::memset(dst, 0, count * sizeof(float)); }
  void add(float* dst, const float* src, size_t count) override {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  }

  double sum_of_squares(const float* x, size_t count) override {
    return layup::sum_of_squares(x, count);
  }
  // The host's work is done when its calls return, so the sum is there at once.
  void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk, size_t end_chunk,
                             double* chunk_sums) override {
    layup::chunk_sums_of_squares(x, count, first_chunk, end_chunk, chunk_sums);
  }

  void start_sum_of_squares(const float* x, size_t count, double* result) override {
    *result = layup::sum_of_squares(x, count);
  }

  void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                         const float* grads, float* m, float* v, const AdamWStep& step,
                         void* bf16_weights) override {
    LAYUP_CHECK(bf16_weights == nullptr,
                "the CPU device computes in fp32 and keeps no bf16 copy of the weights");
    layup::adamw_update_span(layout, span, params, grads, m, v, step);
  }

  void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                              size_t count, float* params, const float* grads, float* m, float* v,
                              const AdamWStep& step) override {
    layup::adamw_update_span_part(layout, span, first, count, params, grads, m, v, step);
  }

  void adamw_update_span_state(const ParameterLayout& layout, const Span& span, float* params,
                               const float* grads, const AdamWMoments& moments,
                               const AdamWStep& step, void* bf16_weights) override {
    LAYUP_CHECK(bf16_weights == nullptr,
                "the CPU device computes in fp32 and keeps no bf16 copy of the weights");
    layup::adamw_update_span(layout, span, params, grads, moments, step);
  }

  void adamw_update_span_part_state(const ParameterLayout& layout, const Span& span, size_t first,
                                    size_t count, float* params, const float* grads,
                                    const AdamWMoments& moments, const AdamWStep& step,
                                    void* bf16_weights) override {
    LAYUP_CHECK(bf16_weights == nullptr,
                "the CPU device computes in fp32 and keeps no bf16 copy of the weights");
    layup::adamw_update_span_part(layout, span, first, count, params, grads, moments, step);
  }

 private:
  static float* zeroed_floats(size_t count) {
    // 64-byte alignment: whole cache lines and aligned AVX-512 loads.
    float* data = static_cast<float*>(
        ::operator new[](count * sizeof(float), std::align_val_t(64), std::nothrow));
    LAYUP_CHECK(data != nullptr || count == 0, "out of host memory allocating ",
                count * sizeof(float) / 1e9,
                " GB, although the memory plan fitted: something else may hold the memory (or a "
                "limit the plan cannot see, such as ulimit -v). Try a smaller --batch or "
                "--seq-len, or see what the run needs with `layup memory`");
    zero_in_parallel(data, count * sizeof(float));
    return data;
  }

  const std::shared_ptr<const DeviceFence> passed_ = std::make_shared<DeviceFence>();
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(std::shared_ptr<MemoryAccountant> accountant) {
  return std::make_unique<CpuDevice>(std::move(accountant));
}

}  // namespace layup
