// The choices a run is made of, as types: the schedule's mode, the device, the compute dtype, the
// layup schedule's clip and head policies, how AdamW keeps its moments, what checkpoints hold. The
// command line parses its strings into these once (cli/); below it only the enums travel, and each
// one's name (for reports, logs and checkpoints' saved settings) comes from the one table here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace layup {

// The schedule (docs/schedules.md).
enum class Mode { kGpu, kOffload, kLayup };
// Where a run computes. A request may say auto; a resolved run is cpu or cuda.
enum class DeviceKind { kAuto, kCpu, kCuda };
// What the backend computes in (the master weights and AdamW are fp32 always). auto: bf16 on
// cuda, fp32 on cpu.
enum class Dtype { kAuto, kFp32, kBf16 };
// How layup honours clipping (docs/schedules.md): speculate and redo, or defer the updates until
// the norm is known; auto picks per device (schedule/schedule_plan.cpp).
enum class LayupClip { kAuto, kSpeculative, kDeferred };
// Where layup updates the embeddings and the final norm; auto picks per device.
enum class LayupHead { kAuto, kDevice, kHost };
// How AdamW keeps its two moments (--optimizer-state; docs/optimizer_state.md): fp32, bfloat16, or
// 8-bit codes of a dynamic map with one fp32 scale per block of kOptimizerStateBlock values. One
// kind for the whole model; the master weights are fp32 in every kind.
enum class OptimizerStateKind { kFp32, kBf16, kBlockwise8Bit };
// How offload and layup sum the micro-batches of a step (--accumulate; docs/schedules.md,
// "Micro-batch accumulation"): micro-batch by micro-batch, each one's gradient added into the
// host's fp32 sum; or layer-major, every micro-batch's forward first, then each block's backward
// of every micro-batch in turn, summed on the device, so the host gets one gradient a block.
// Both give the same bits; auto (the flag's default) is resolved by the plan
// (choose_schedule_options) into one of them.
enum class Accumulation { kMicroBatchMajor, kLayerMajor, kAuto };
// What a training run's checkpoints hold: the weights and the training state (resumable), or the
// weights only (an export for transformers or `layup sample`, a third of the disk).
enum class CheckpointContents { kFull, kWeights };
// How many host-updated blocks keep no compute weights on the device and are streamed to it
// block by block (--streamed-blocks; docs/memory.md, "Streamed weights"): auto lets the planner
// choose the fewest that fit the device's budget (none where everything fits); N streams the last
// N blocks the host updates.
struct StreamedBlocks {
  bool automatic = true;
  int count = 0;          // asked, or what auto resolved to
  bool resolved = false;  // auto, with count chosen by the planner

  // What was asked, or what auto resolved to (0 before).
  int blocks() const { return automatic && !resolved ? 0 : count; }
  // "auto", "4", "auto (4)" once resolved.
  std::string name() const {
    if (!automatic) return std::to_string(count);
    return resolved ? "auto (" + std::to_string(count) + ")" : "auto";
  }
  // Throws layup::Error for anything but auto or a whole number of 0 or more.
  static StreamedBlocks parse(const std::string& text) {
    if (text == "auto") return {};
    const bool digits = !text.empty() && text.size() <= 6 &&
                        text.find_first_not_of("0123456789") == std::string::npos;
    if (!digits)
      fail("--streamed-blocks takes auto or a number of blocks (0 or more), not '", text, "'");
    return {false, std::stoi(text), false};
  }
};
// Where layup keeps the blocks' fp32 master weights and AdamW moments (--optimizer-placement):
// auto lets the planner choose against each tier's budget (engine/memory_planner.h); otherwise
// the first device_blocks blocks on the device, the last disk_blocks in a file under
// --offload-dir, staged_blocks of the rest spread over them with their state on the host and
// their AdamW on the device (staged through a slot in device memory; offload too), the rest on
// the host ("host" is device:0).
struct OptimizerPlacement {
  bool automatic = true;
  int device_blocks = 0;
  bool resolved = false;  // auto, with device_blocks, disk_blocks, staged_blocks chosen
  int disk_blocks = 0;
  int staged_blocks = 0;

  // Blocks on the device, on disk and staged: what was asked, or what auto resolved to (0
  // before).
  int blocks_on_device() const { return automatic && !resolved ? 0 : device_blocks; }
  int blocks_on_disk() const { return automatic && !resolved ? 0 : disk_blocks; }
  int blocks_staged() const { return automatic && !resolved ? 0 : staged_blocks; }
  // "auto", "host", "device:12", "disk:4", "device:12,disk:4", "staged:12", "device:2,staged:12";
  // "auto (device:12)" once resolved.
  std::string name() const {
    std::string split;
    if (device_blocks > 0) split = "device:" + std::to_string(device_blocks);
    if (disk_blocks > 0)
      split += (split.empty() ? "disk:" : ",disk:") + std::to_string(disk_blocks);
    if (staged_blocks > 0)
      split += (split.empty() ? "staged:" : ",staged:") + std::to_string(staged_blocks);
    if (split.empty()) split = "host";
    if (!automatic) return split;
    return resolved ? "auto (" + split + ")" : "auto";
  }
  // Throws layup::Error for anything else, saying what it takes.
  static OptimizerPlacement parse(const std::string& text) {
    if (text == "auto") return {};
    OptimizerPlacement placement{false, 0, false, 0, 0};
    if (text == "host") return placement;
    // device:K, disk:D, staged:S, joined by commas, each at most once.
    bool device = false, disk = false, staged = false, valid = !text.empty();
    size_t start = 0;
    while (valid && start <= text.size()) {
      const size_t comma = text.find(',', start);
      const std::string part =
          text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const size_t colon = part.find(':');
      const std::string tier = part.substr(0, colon);
      const std::string count = colon == std::string::npos ? "" : part.substr(colon + 1);
      size_t used = 0;
      int blocks = -1;
      try {
        blocks = std::stoi(count, &used);
      } catch (const std::exception&) {
      }
      valid = used == count.size() && blocks >= 0 &&
              ((tier == "device" && !device) || (tier == "disk" && !disk) ||
               (tier == "staged" && !staged));
      if (valid && tier == "device") {
        device = true;
        placement.device_blocks = blocks;
      } else if (valid && tier == "disk") {
        disk = true;
        placement.disk_blocks = blocks;
      } else if (valid) {
        staged = true;
        placement.staged_blocks = blocks;
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (valid) return placement;
    fail(
        "--optimizer-placement takes auto, host, or device:K, disk:D and staged:S joined by commas "
        "(the first K blocks' optimizer state on the device, the last D in a file under "
        "--offload-dir, S blocks spread over the rest with their state on the host and their "
        "AdamW on the device, the rest on the host), got '",
        text, "'");
  }
  bool operator==(const OptimizerPlacement&) const = default;
};

// One enum's names, in the order of its values.
template <class Enum, size_t N>
using EnumNames = std::array<std::pair<Enum, std::string_view>, N>;

inline constexpr EnumNames<Mode, 3> kModeNames = {
    {{Mode::kGpu, "gpu"}, {Mode::kOffload, "offload"}, {Mode::kLayup, "layup"}}};
inline constexpr EnumNames<DeviceKind, 3> kDeviceNames = {
    {{DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}}};
inline constexpr EnumNames<Dtype, 3> kDtypeNames = {
    {{Dtype::kAuto, "auto"}, {Dtype::kFp32, "fp32"}, {Dtype::kBf16, "bf16"}}};
inline constexpr EnumNames<LayupClip, 3> kLayupClipNames = {
    {{LayupClip::kAuto, "auto"},
     {LayupClip::kSpeculative, "speculative"},
     {LayupClip::kDeferred, "deferred"}}};
inline constexpr EnumNames<LayupHead, 3> kLayupHeadNames = {
    {{LayupHead::kAuto, "auto"}, {LayupHead::kDevice, "device"}, {LayupHead::kHost, "host"}}};

inline constexpr EnumNames<OptimizerStateKind, 3> kOptimizerStateKindNames = {
    {{OptimizerStateKind::kFp32, "fp32"},
     {OptimizerStateKind::kBf16, "bf16"},
     {OptimizerStateKind::kBlockwise8Bit, "8bit"}}};

inline constexpr EnumNames<Accumulation, 3> kAccumulationNames = {
    {{Accumulation::kAuto, "auto"},
     {Accumulation::kMicroBatchMajor, "micro-batch-major"},
     {Accumulation::kLayerMajor, "layer-major"}}};

inline constexpr EnumNames<CheckpointContents, 2> kCheckpointContentsNames = {
    {{CheckpointContents::kFull, "full"}, {CheckpointContents::kWeights, "weights"}}};

template <class Enum, size_t N>
std::string name_in(const EnumNames<Enum, N>& names, Enum value) {
  for (const auto& [each, name] : names)
    if (each == value) return std::string(name);
  return "unknown";
}

// The value named `text` ("--mode" etc. in `flag` for the message); throws layup::Error listing
// the names there are.
template <class Enum, size_t N>
Enum parse_in(const EnumNames<Enum, N>& names, const std::string& text, const char* flag) {
  std::string listed;
  for (const auto& [each, name] : names) {
    if (name == text) return each;
    listed += (listed.empty() ? "" : ", ") + std::string(name);
  }
  fail(flag, " takes one of ", listed, " (got '", text, "')");
}

inline std::string name_of(Mode mode) {
  return name_in(kModeNames, mode);
}
inline std::string name_of(DeviceKind device) {
  return name_in(kDeviceNames, device);
}
inline std::string name_of(Dtype dtype) {
  return name_in(kDtypeNames, dtype);
}
inline std::string name_of(LayupClip clip) {
  return name_in(kLayupClipNames, clip);
}
inline std::string name_of(LayupHead head) {
  return name_in(kLayupHeadNames, head);
}
inline std::string name_of(CheckpointContents contents) {
  return name_in(kCheckpointContentsNames, contents);
}
inline std::string name_of(OptimizerStateKind kind) {
  return name_in(kOptimizerStateKindNames, kind);
}
inline std::string name_of(Accumulation accumulation) {
  return name_in(kAccumulationNames, accumulation);
}

// 8-bit moments are quantised in blocks of this many consecutive values of a span (or of a rank's
// part of one, which then starts at a block boundary), counted from its first element; the last
// block may be short. Each block keeps one fp32 scale per moment.
inline constexpr size_t kOptimizerStateBlock = 256;

// The blocks of `count` values: one scale per moment each in 8-bit state.
inline constexpr size_t optimizer_state_blocks(size_t count) {
  return (count + kOptimizerStateBlock - 1) / kOptimizerStateBlock;
}

// Bytes of AdamW's two moments for `count` parameters (one span, or a rank's part of one) in
// `kind`, as optim/adamw_moments.h lays them out in one buffer: 8 a parameter in fp32, 4 in bf16,
// 2 and two fp32 scales a block in 8-bit. The master weights (4 bytes a parameter) are apart.
inline constexpr size_t optimizer_moments_bytes(OptimizerStateKind kind, size_t count) {
  switch (kind) {
    case OptimizerStateKind::kFp32:
      return 2 * sizeof(float) * count;
    case OptimizerStateKind::kBf16:
      return 2 * sizeof(uint16_t) * count;
    case OptimizerStateKind::kBlockwise8Bit:
      return 2 * count + 2 * sizeof(float) * optimizer_state_blocks(count);
  }
  return 0;
}

// The same rounded up to whole floats: what one span's moments take where the spans' moments
// follow one another (an 8-bit span's block scales must start 4-byte aligned), and the coded
// moments a span's state carries out of a schedule and into a checkpoint.
inline constexpr size_t optimizer_moments_padded_bytes(OptimizerStateKind kind, size_t count) {
  return (optimizer_moments_bytes(kind, count) + sizeof(float) - 1) / sizeof(float) * sizeof(float);
}

}  // namespace layup
