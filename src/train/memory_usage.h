// How much memory a run holds, as the progress line and `layup bench` report it, until the
// accounting allocator (per tensor class and memory kind) replaces these process-wide readings.
#pragma once

namespace layup {

// Bytes in use on the current GPU: cudaMemGetInfo's total - free, which counts every process on
// the GPU and the CUDA context. -1 without a usable GPU or in a CPU-only build.
long long device_memory_used_bytes();

// The peak resident set of this process so far (/proc/self/status VmHWM, else getrusage), in bytes.
long long process_peak_rss_bytes();

}  // namespace layup
