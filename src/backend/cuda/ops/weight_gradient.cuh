// How the ops that produce weight gradients (matmul, layer norm) treat the memory they write.
#pragma once

namespace layup::cuda {

// Whether an op adds its weight gradients to what their memory holds or overwrites it. The
// model's backward overwrites: each micro-batch's gradient then lands in memory nobody has to
// zero first, and the weight-gradient GEMMs do not read the old values (together 8 bytes a
// parameter a step less to move). Accumulating is for a caller that sums contributions in place.
enum class WeightGradient { kAccumulate, kOverwrite };

}  // namespace layup::cuda
