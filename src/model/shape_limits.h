// How large a run's shape may be before its sizes stop meaning anything: the model's widths held
// in 32-bit integers, the tokens of a micro-batch the backends index with 32-bit integers, the
// blocks the layout and the schedules keep records for, and the elements the plan counts in
// 64-bit bytes. Checked before any layout, plan or buffer is made, naming the flag to change.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "model/model_config.h"

namespace layup {

// The most elements the parameters, or one micro-batch's activations, may count: 2^50, 4 PiB of
// fp32, past any machine, and low enough that a plan's few dozen buffers of at most 8 bytes an
// element sum within 64 bits (2^50 x 8 x 64 = 2^59).
inline constexpr uint64_t kMaxShapeElements = uint64_t{1} << 50;
// The most blocks: each costs the layout and the plan records of their own (~20 us of a plan's
// time on one core, whatever the block's width), and a refusal plans up to ~100 times, so
// 2 billion narrow blocks would hang the planning long before their tensors count. The deepest
// published transformers have ~10^3.
inline constexpr int kMaxLayers = 1 << 12;

// The first of the run's sizes past its limit, blamed on the first flag in the order --dim,
// --heads, --layers, --context, --seq-len, --batch that takes it there with the flags before it
// as given and those after it at 1.
struct ShapeLimitBreach {
  std::string flag;       // "--dim"
  long long value = 0;    // as given
  long long largest = 0;  // the largest value of the flag within every limit, the flags before
                          // it as given and those after it at 1 (at least 1)
  std::string limit;      // what it went past, as a phrase
  std::string message() const;  // one line: the flag, its value, the limit, what to give instead
};

// Where the shape of `config` at `batch` x `seq_len` first goes past a limit; nothing where it is
// within them all, or where a size is below 1 (its own check's to refuse). Closed form: the time
// does not grow with any size.
std::optional<ShapeLimitBreach> shape_limit_breach(const ModelConfig& config, int batch,
                                                   int seq_len);

// Throws layup::Error with the breach's message where there is one.
void check_shape_limits(const ModelConfig& config, int batch, int seq_len);

}  // namespace layup
