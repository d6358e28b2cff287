// The three modes' schedules, each built by make_schedule (schedule.h) and listing its buffers for
// schedule_buffers: what only schedule/ itself calls.
#pragma once

#include <memory>

#include "schedule/schedule.h"

namespace layup {

// The `gpu` mode: parameters, full gradients and AdamW state in the backend's memory; forward,
// full backward, clip, update: the planned schedule with every span updated on the device and
// nothing on the host. Of ScheduleOptions, its placement, ranks, optimizer shards and state kind.
std::unique_ptr<Schedule> make_gpu_schedule(std::unique_ptr<ModelBackend> backend,
                                            std::unique_ptr<Device> device,
                                            const ParameterLayout& layout,
                                            const ScheduleOptions& options);
BufferList gpu_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                DeviceKinds kinds, int micro_batches);

// The `offload` mode (ZeRO-Offload style baseline): forward and full backward into a whole-model
// gradient buffer on the device; the gradient is copied to the host span by span, the CPU clips
// and runs AdamW on host fp32 master weights and moments, and the new weights are copied back.
// Nothing overlaps. The CPU side runs on options.cpu_workers workers (0: one per core this
// process may use).
std::unique_ptr<Schedule> make_offload_schedule(std::unique_ptr<ModelBackend> backend,
                                                std::unique_ptr<Device> device,
                                                const ParameterLayout& layout,
                                                const ScheduleOptions& options);
BufferList offload_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                    DeviceKinds kinds, int micro_batches);

// The `layup` mode (the paper's schedule): the device thread runs backward block by block into two
// gradient slots (WeightGradSlots); each finished slot is handed to the CPU, and that block is
// updated there by cpu_workers pinned HostAdamW workers (0: one per core this process may use),
// overlapped with the backward of the blocks below it, or, with clipping, once the global norm is
// known (deferred, overlapped with the next forward; or speculative with speculative_clip). Spans
// placed on the device by update_sites are updated there once the norm is known. Without
// host_gradient each block is updated from its slot, and steps that clip or accumulate are
// refused. See docs/schedules.md.
//
// A non-finite loss, or with clipping a non-finite norm, updates nothing. Without clipping a
// non-finite gradient is found block by block, after the blocks above were updated: the step
// reports applied = false, and the blocks whose own gradient was finite stay updated.
std::unique_ptr<Schedule> make_layup_schedule(std::unique_ptr<ModelBackend> backend,
                                              std::unique_ptr<Device> device,
                                              const ParameterLayout& layout,
                                              const ScheduleOptions& options);
BufferList layup_schedule_buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                                  DeviceKinds kinds, int micro_batches);

}  // namespace layup
