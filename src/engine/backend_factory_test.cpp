// The backend factory's option checks: --algorithms names, and the CUDA-only options refused on
// the CPU backend with a message that says what to do.
#include "engine/backend_factory.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "model/model_config.h"

namespace layup {
namespace {

// The message of the layup::Error `make` throws ("" when it throws none).
template <class Make>
std::string error_of(Make make) {
  try {
    make();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(BackendFactory, CpuBackendRefusesCudaOnlyOptions) {
  const ModelConfig config = gpt2_config(2, 2, 16, 8, 61);
  ComputeTarget timed{DeviceKind::kCpu, Dtype::kFp32};
  timed.algorithms = AlgorithmChoice::kTimed;
  std::string message = error_of([&] { make_backend(timed, config, 1, 4); });
  EXPECT_NE(message.find("--algorithms timed"), std::string::npos) << message;
  EXPECT_NE(message.find("--device cuda"), std::string::npos) << message;

  ComputeTarget recompute{DeviceKind::kCpu, Dtype::kFp32, 1};
  message = error_of([&] { make_backend(recompute, config, 1, 4); });
  EXPECT_NE(message.find("--recompute"), std::string::npos) << message;

  // The defaults build a CPU backend.
  EXPECT_NE(make_backend(ComputeTarget{DeviceKind::kCpu, Dtype::kFp32}, config, 1, 4).backend,
            nullptr);
}

}  // namespace
}  // namespace layup
