// A batch of token ids as every layer above the model sees it: the data folder makes them, the
// backends compute on them, the schedules and the sampler pass them on.
#pragma once

#include <cstdint>

namespace layup {

// B sequences of T token ids. targets may be null for inference (no loss, no backward).
struct TokenBatch {
  const int32_t* inputs = nullptr;   // [B, T]
  const int32_t* targets = nullptr;  // [B, T] or null
  int batch = 0;                     // B
  int seq_len = 0;                   // T
};

}  // namespace layup
