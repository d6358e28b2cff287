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

  ComputeTarget attention{DeviceKind::kCpu, Dtype::kFp32};
  attention.attention = AttentionChoice::kLayup;
  message = error_of([&] { make_backend(attention, config, 1, 4); });
  EXPECT_NE(message.find("--attention layup (or LAYUP_ATTENTION=layup) is a CUDA backend option"),
            std::string::npos)
      << message;

  // The defaults build a CPU backend.
  EXPECT_NE(make_backend(ComputeTarget{DeviceKind::kCpu, Dtype::kFp32}, config, 1, 4).backend,
            nullptr);
}

// Refused when the target is resolved, before the run is planned, as every CUDA-only option is;
// --attention auto, the default, stays fine on the CPU.
TEST(BackendFactory, CudaOnlyOptionsAreRefusedWhenTheTargetResolvesToTheCpu) {
  for (const AttentionChoice choice : {AttentionChoice::kCudnn, AttentionChoice::kLayup}) {
    ComputeTarget target{DeviceKind::kCpu, Dtype::kAuto};
    target.attention = choice;
    const std::string message = error_of([&] { resolve_compute_target(target); });
    EXPECT_NE(message.find("--attention " + name_of(choice) + " (or LAYUP_ATTENTION=" +
                           name_of(choice) + ") is a CUDA backend option"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("or use --device cuda"), std::string::npos) << message;
  }
  ComputeTarget recompute{DeviceKind::kCpu, Dtype::kFp32, 2};
  EXPECT_NE(error_of([&] { resolve_compute_target(recompute); }).find("--recompute 2"),
            std::string::npos);
  ComputeTarget timed{DeviceKind::kCpu, Dtype::kFp32};
  timed.algorithms = AlgorithmChoice::kTimed;
  EXPECT_NE(error_of([&] { resolve_compute_target(timed); }).find("--algorithms timed"),
            std::string::npos);

  const ComputeTarget plain = resolve_compute_target({DeviceKind::kCpu, Dtype::kAuto});
  EXPECT_EQ(plain.attention, AttentionChoice::kAuto);
  EXPECT_EQ(plain.dtype, Dtype::kFp32);

  // Where --device auto lands on the CPU (no CUDA here), the message says why it did.
  if (resolve_compute_target({}).device == DeviceKind::kCpu) {
    ComputeTarget automatic;
    automatic.attention = AttentionChoice::kCudnn;
    EXPECT_NE(
        error_of([&] { resolve_compute_target(automatic); }).find("(--device auto chose the CPU: "),
        std::string::npos);
  }
}

}  // namespace
}  // namespace layup
