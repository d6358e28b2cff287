// Test support for the CUDA tests: skip without a GPU, device arrays, dtype round trips, and the
// relative error every CUDA test is judged by. Used only by the *_test.cu files.
//
// The error measure is ||actual - expected|| / ||expected - baseline|| over a whole tensor (L2
// norms, in double). For outputs that are written, the baseline is zero: the plain relative error.
// For outputs that accumulate, the baseline is the value the output held before the op (the same
// on both sides), so the error is measured against the size of what the op added, not of what was
// already there.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"

// Every CUDA test starts with this: on a machine without a usable GPU the test is skipped, with the
// reason, instead of failing.
#define LAYUP_REQUIRE_GPU()                                           \
  do {                                                                \
    std::string layup_gpu_missing_;                                   \
    if (!::layup::cuda_device_available(&layup_gpu_missing_))         \
      GTEST_SKIP() << "no GPU for this test: " << layup_gpu_missing_; \
  } while (0)

namespace layup::cuda_test {

// cudaMalloc'd memory for `count` elements of U, starting `offset` elements past an aligned
// allocation (offset > 0 exercises the kernels' unaligned paths).
template <class U>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count, size_t offset = 0) : count_(count) {
    LAYUP_CUDA_CHECK(cudaMalloc(&allocation_, (count + offset + 1) * sizeof(U)));
    data_ = allocation_ + offset;
  }
  DeviceArray(const std::vector<U>& host, size_t offset = 0) : DeviceArray(host.size(), offset) {
    upload(host);
  }
  ~DeviceArray() { cudaFree(allocation_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  U* get() const { return data_; }
  size_t size() const { return count_; }

  void upload(const std::vector<U>& host) {
    EXPECT_EQ(host.size(), count_);
    LAYUP_CUDA_CHECK(cudaMemcpy(data_, host.data(), count_ * sizeof(U), cudaMemcpyHostToDevice));
  }
  std::vector<U> download() const {
    std::vector<U> host(count_);
    LAYUP_CUDA_CHECK(cudaMemcpy(host.data(), data_, count_ * sizeof(U), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bits set: NaN as float and as bf16, so any element an op fails to write shows up.
  void poison() { LAYUP_CUDA_CHECK(cudaMemset(data_, 0xFF, count_ * sizeof(U))); }

 private:
  U* allocation_ = nullptr;
  U* data_ = nullptr;
  size_t count_;
};

inline float to_float(float x) {
  return x;
}
inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return __float2bfloat16(x);
}

// The values as T, and back: what the GPU will actually see (bf16 rounds to 8 mantissa bits).
template <class T>
std::vector<T> convert(const std::vector<float>& values) {
  std::vector<T> result(values.size());
  for (size_t i = 0; i < values.size(); ++i) result[i] = from_float<T>(values[i]);
  return result;
}
template <class T>
std::vector<float> to_floats(const std::vector<T>& values) {
  std::vector<float> result(values.size());
  for (size_t i = 0; i < values.size(); ++i) result[i] = to_float(values[i]);
  return result;
}
template <class T>
std::vector<float> rounded(const std::vector<float>& values) {
  return to_floats(convert<T>(values));
}

// A device copy of host floats, converted to T.
template <class T>
struct DeviceTensor {
  explicit DeviceTensor(const std::vector<float>& values, size_t offset = 0)
      : array(convert<T>(values), offset) {}
  explicit DeviceTensor(size_t count, size_t offset = 0) : array(count, offset) {}
  T* get() const { return array.get(); }
  std::vector<float> floats() const { return to_floats(array.download()); }
  DeviceArray<T> array;
};

// ||actual - expected|| / ||expected - baseline||; an empty baseline means zero. When the
// denominator is zero the numerator itself is returned (so equal-and-zero passes).
inline double relative_error(const std::vector<float>& actual, const std::vector<float>& expected,
                             const std::vector<float>& baseline = {}) {
  EXPECT_EQ(actual.size(), expected.size());
  double difference = 0.0, reference = 0.0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    const double r = static_cast<double>(expected[i]) - (baseline.empty() ? 0.0 : baseline[i]);
    difference += d * d;
    reference += r * r;
  }
  if (reference == 0.0) return std::sqrt(difference);
  return std::sqrt(difference / reference);
}

// The baseline of an accumulating check whose accumulator has the activation type T. An fp32
// accumulator keeps the sum exactly enough to compare what the op added; a bf16 accumulator
// rounds the whole sum to 8 bits, which on a small sum of a large initial value is more than 1e-2
// of the part added, so bf16 is measured against the sum itself: ||out - ref|| / ||ref||.
template <class T>
std::vector<float> accumulator_baseline(const std::vector<float>& initial) {
  return std::is_same_v<T, float> ? initial : std::vector<float>{};
}

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

template <class T>
const char* dtype_name() {
  return std::is_same_v<T, float> ? "fp32" : "bf16";
}

// Runs check<float>(args...) and check<__nv_bfloat16>(args...), each under a trace naming it.
#define LAYUP_FOR_EACH_DTYPE(check, ...) \
  do {                                   \
    {                                    \
      SCOPED_TRACE("fp32");              \
      check<float>(__VA_ARGS__);         \
    }                                    \
    {                                    \
      SCOPED_TRACE("bf16");              \
      check<__nv_bfloat16>(__VA_ARGS__); \
    }                                    \
  } while (0)

// Expects relative_error(actual, expected, baseline) <= tol, naming the tensor and the error. A
// NaN anywhere (an element left poisoned) makes the error NaN, which fails.
#define LAYUP_EXPECT_RELATIVE(actual, expected, baseline, tol, what)                            \
  do {                                                                                          \
    const double layup_error_ = ::layup::cuda_test::relative_error(actual, expected, baseline); \
    EXPECT_LE(layup_error_, tol) << (what) << ": relative error " << layup_error_ << " (limit " \
                                 << (tol) << ")";                                               \
  } while (0)

}  // namespace layup::cuda_test
