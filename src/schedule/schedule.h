// A schedule decides where parameters, gradients and optimizer state live and in which order
// forward, backward and the AdamW update run. The trainer sees only this interface.
//
// Modes (shared/DESIGN.md): `gpu` keeps everything on the device and updates after backward;
// `offload` and `layup` keep fp32 master weights, the accumulated gradient and the AdamW moments
// on the host and run AdamW on the CPU. The three modes agree bitwise on the CPU backend.
//
// Tracing (trace/trace_recorder.h): with set_trace, a schedule records each step's work on the
// track "GPU" (the thread that issues device work; on the CPU backend, the host thread that plays
// the device) and its host-side work on the tracks "cpu worker i".
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

class TraceRecorder;

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

  // Records the spans of every later step into `recorder` (null: stop). Call between steps; the
  // recorder must outlive the steps it records. A schedule with worker threads overrides it to
  // make their tracks too.
  virtual void set_trace(TraceRecorder* recorder);

 protected:
  TraceRecorder* trace_ = nullptr;
  int device_track_ = 0;  // "GPU" in trace_
};

// The modes `--mode` takes: gpu, offload, layup.
const std::vector<std::string>& schedule_modes();

// The schedule of a mode, by name; cpu_workers is used by `layup` only. Throws layup::Error for
// an unknown mode, naming the ones there are.
std::unique_ptr<Schedule> make_schedule(const std::string& mode,
                                        std::unique_ptr<ModelBackend> backend,
                                        std::unique_ptr<Device> device,
                                        const ParameterLayout& layout, int cpu_workers);

// One line for logs and reports: what the mode does, with this many CPU workers and this clip
// threshold (<= 0: none); for `layup`, how clipping is honoured.
std::string describe_schedule(const std::string& mode, int cpu_workers, float clip_max_norm);

// The trace name of the AdamW update of one span kind: "adamw embeddings", "adamw block" (with the
// layer as the span's index), "adamw final_norm".
const char* adamw_trace_name(SpanKind kind);

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
