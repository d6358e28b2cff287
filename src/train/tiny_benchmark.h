// For tests: the benchmark options of a tiny model (2 layers of width 32 over a 300-token
// vocabulary) that runs a few steps on the CPU in milliseconds. Tests change what they pin.
#pragma once

#include "train/benchmark.h"

namespace layup {

inline BenchmarkOptions tiny_benchmark_options() {
  BenchmarkOptions options;
  options.model_name = "tiny";
  options.model.n_layer = 2;
  options.model.n_head = 2;
  options.model.n_embd = 32;
  options.model.n_positions = 32;
  options.model.vocab_size = 300;
  options.model.padded_vocab_size = pad_vocab_size(300);
  options.batch = 2;
  options.seq_len = 16;
  options.warmup_steps = 1;
  options.steps = 2;
  options.device = DeviceKind::kCpu;
  options.dtype = Dtype::kFp32;
  return options;
}

}  // namespace layup
