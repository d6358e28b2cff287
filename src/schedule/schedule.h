// A schedule decides where parameters, gradients and optimizer state live and in which order
// forward, backward and the AdamW update run. The trainer sees only this interface.
//
// Modes (shared/DESIGN.md): `gpu` keeps everything on the device and updates after backward;
// `offload` and `layup` keep fp32 master weights, the accumulated gradient and the AdamW moments
// on the host and run AdamW on the CPU. The three modes agree bitwise on the CPU backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/model_backend.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"

namespace layup {

struct StepStats {
  float loss = 0.0f;         // mean over the micro-batches
  double grad_norm = 0.0;    // global L2 norm of the accumulated gradient, before clipping
  float clip_factor = 1.0f;  // what the gradient was multiplied by (1 = not clipped)
  bool applied = false;      // false when the loss or the norm was not finite: nothing changed
};

// What one update uses: the AdamW values at this step (lr from the schedule, t = update count)
// and the clip threshold (<= 0: no clipping).
struct UpdateSettings {
  AdamWStep adamw;
  float clip_max_norm = 1.0f;
};

// Parameters and AdamW moments in layout order: what a checkpoint holds.
struct OptimizerTensors {
  std::vector<float> params, adam_m, adam_v;
};

class Schedule {
 public:
  virtual ~Schedule() = default;

  virtual std::string name() const = 0;

  // One optimizer update from the gradient accumulated over all micro-batches (each weighted
  // 1/N). When the loss or gradient norm is not finite, nothing is updated.
  virtual StepStats step(std::span<const TokenBatch> micro_batches,
                         const UpdateSettings& settings) = 0;

  // Mean loss of a batch under the current parameters; changes nothing.
  virtual float evaluate(const TokenBatch& batch) = 0;

  // Logits of a batch ([B, T, padded_vocab], host memory, valid until the next call).
  virtual const float* forward_logits(const TokenBatch& batch) = 0;

  virtual OptimizerTensors export_tensors() const = 0;
  virtual void import_tensors(const OptimizerTensors& tensors) = 0;
};

// The `gpu` mode: parameters, full gradients and AdamW state in the backend's memory; forward,
// full backward, clip, update.
std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout);

// The `offload` mode (ZeRO-Offload style baseline): forward and full backward into a whole-model
// gradient buffer on the device; the gradient is copied to the host span by span, the CPU clips
// and runs AdamW on host fp32 master weights and moments, and the new weights are copied back.
// Nothing overlaps.
std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout);

// The `layup` mode (the paper's schedule): the device thread runs backward block by block into two
// gradient slots (WeightGradSlots); each finished slot goes to cpu_workers CPU threads that
// stream it into the host's fp32 gradient and run AdamW on that block. Without clipping
// (clip_max_norm <= 0) blocks are updated during backward, overlapped with it; with clipping the
// global norm is known at the end of backward and the CPU then updates every block before the
// step returns (exact, DESIGN.md design (a)). Embeddings and the final norm are updated after
// backward_embeddings, once.
std::unique_ptr<Schedule> make_layup_schedule(std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& layout, int cpu_workers = 2);

}  // namespace layup
