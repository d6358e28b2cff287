// The device a backend computes on, as the schedules see it: memory, copies, and the two bulk
// operations of an optimizer step (gradient norm, AdamW), so one schedule serves every backend.
//
// On the CPU backend "device memory" is host memory and the operations run on the host; on the
// CUDA backend they are cudaMalloc'd buffers and kernels.
//
// Overlap. The host-side schedules (offload, layup) move gradients out and weights in while the
// device keeps computing, through three calls: fence() marks a point in the device's work (after
// a block's backward, say), copy_to_host_after() copies once that point has passed without waiting
// for the work issued after it, and copy_to_device_async() starts a copy and reports when it has
// landed. Host memory from allocate_host() is what the device copies fastest (pinned on CUDA).
//
// Every allocation names its tensor class and is recorded in the device's MemoryAccountant
// (memory/memory_accountant.h) for as long as its buffer lives: allocate() as device-side memory
// of the device's kind (host on the CPU backend, device on CUDA), allocate_host() as host-side
// memory of host_memory_kind().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "memory/memory_accountant.h"
#include "memory/planned_allocation.h"
#include "memory/tensor_class.h"
#include "model/parameter_layout.h"
#include "optim/adamw.h"
#include "optim/adamw_state.h"

namespace layup {

class Device;

// Floats a device allocated, in its own memory (allocate) or in host memory for copies
// (allocate_host), freed by that device when the buffer goes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `record` holds the buffer's bytes in the accountant until the buffer goes; `kind` says how
  // the device frees it.
  DeviceBuffer(Device* device, float* data, size_t count, MemoryRecord record, MemoryKind kind)
      : device_(device), data_(data), count_(count), record_(std::move(record)), kind_(kind) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  float* data() const { return data_; }
  size_t count() const { return count_; }
  float* begin() const { return data_; }
  float* end() const { return data_ + count_; }

 private:
  Device* device_ = nullptr;
  float* data_ = nullptr;
  size_t count_ = 0;
  MemoryRecord record_;
  MemoryKind kind_ = MemoryKind::kDevice;
};

// A point in a device's work (Device::fence): passed once all the work issued before it is done.
class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
};

// The kinds a device hands out: its own memory (Device::allocate) and the host memory it copies
// to and from fastest (Device::allocate_host). Components list their buffers in these kinds
// before any device exists (memory/planned_allocation.h).
struct DeviceKinds {
  MemoryKind own = MemoryKind::kHost;
  MemoryKind host_copy = MemoryKind::kHost;
};

// Collectives across the ranks of a data-parallel run over buffers in a device's memory (NCCL on
// CUDA), issued in order with the device's other work.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // Every rank's `count` floats (device memory) summed element by element from +0 in rank order,
  // into every rank's `data`: the bits Communicator::sum_in_rank_order gives in host memory.
  virtual void sum_in_rank_order(float* data, size_t count) = 0;
  // The same sum, started once `after` (a fence of `device`) has passed, beside the device's work
  // and without waiting for work issued after the fence (on CUDA on a stream of its own): a
  // block's gradient summed while the device computes the blocks below. Returns a fence that
  // passes once the sums are in `data`; device work that reads or writes `data` must be ordered
  // after it (Device::order_after). Sums started one after another run in that order. The base
  // waits for `after` and sums on the calling thread.
  virtual std::shared_ptr<const DeviceFence> start_sum_in_rank_order(Device& device,
                                                                     const DeviceFence& after,
                                                                     float* data, size_t count);
  // ZeRO-1 (docs/parallel.md) in device memory: Communicator::reduce_scatter_in_rank_order's and
  // all_gather's bits (rank r owns [bounds[r], bounds[r + 1]) of `data`), ordered with the
  // device's other work both ways.
  virtual void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) = 0;
  virtual void all_gather(float* data, std::span<const size_t> bounds) = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;

  // A zeroed buffer of `count` floats of memory `kind`, recorded in accountant() as `tensor_class`
  // on `side` while it lives: what a placement (memory/memory_plan.h) asks for a class. On CUDA:
  // device (cudaMalloc), pinned (cudaHostAlloc, mapped: the GPU reads and writes it in place
  // over the interconnect), managed (cudaMallocManaged, refused beyond the GPU's free memory),
  // pageable and host (plain host memory; pageable only where the GPU can reach it). The CPU
  // backend has host memory only. Throws layup::Error for a kind the device cannot make.
  virtual DeviceBuffer allocate_kind(size_t count, TensorClass tensor_class, MemorySide side,
                                     MemoryKind kind) = 0;
  // A buffer in device memory (memory_kind(), device side): what the device computes on.
  DeviceBuffer allocate(size_t count, TensorClass tensor_class) {
    return allocate_kind(count, tensor_class, MemorySide::kDevice, memory_kind());
  }
  // A buffer in host memory the device copies to and from fastest (host_memory_kind(), host
  // side: master weights, gradient accumulators, staging). On CUDA it is pinned (page-locked and
  // mapped), so copies to and from it are DMA transfers that run beside the compute.
  DeviceBuffer allocate_host(size_t count, TensorClass tensor_class) {
    return allocate_kind(count, tensor_class, MemorySide::kHost, host_memory_kind());
  }
  // The buffer a component listed (its side, class, kind and bytes).
  DeviceBuffer allocate(const PlannedAllocation& buffer) {
    return allocate_kind(buffer.floats(), buffer.tensor_class, buffer.side, buffer.kind);
  }
  // Frees what allocate_kind returned as `kind`; DeviceBuffer calls it.
  virtual void release(float* data, MemoryKind kind) = 0;

  // The kind of memory allocate() hands out: host on the CPU backend, device on CUDA.
  virtual MemoryKind memory_kind() const = 0;
  // The kind allocate_host() hands out: host on the CPU backend, pinned on CUDA.
  virtual MemoryKind host_memory_kind() const = 0;
  DeviceKinds kinds() const { return {memory_kind(), host_memory_kind()}; }
  // The ledger this device records into; a run shares it with its backend.
  const std::shared_ptr<MemoryAccountant>& accountant() const { return accountant_; }

  // Copies ordered with all device work: they start after everything issued before them and
  // return when done.
  virtual void copy_to_device(float* device_dst, const float* host_src, size_t count) = 0;
  virtual void copy_to_host(float* host_dst, const float* device_src, size_t count) = 0;

  // A fence after all device work issued so far, by any thread. Cheap: one per block is fine.
  virtual std::shared_ptr<const DeviceFence> fence() = 0;
  // Returns once `fence` has passed (on the CPU backend at once: its work is done when its calls
  // return).
  virtual void wait_for(const DeviceFence& fence) = 0;
  // Copies device memory to host memory once `after` has passed, without waiting for device work
  // issued after the fence (a block's gradient while the next block's backward runs), and
  // returns when the copy has landed. Any thread may call it.
  virtual void copy_to_host_after(const DeviceFence& after, float* host_dst,
                                  const float* device_src, size_t count) = 0;
  // Starts copying host memory to device memory and returns; `landed` runs once the copy is
  // complete (on the CPU backend before this returns; on CUDA on CUDA's callback thread, so it
  // must not call CUDA, throw, or block for long). The copy is NOT ordered with device work: the
  // caller guarantees that no issued device work touches device_dst, and that nothing reads
  // device_dst or writes host_src until `landed` has run.
  virtual void copy_to_device_async(float* device_dst, const float* host_src, size_t count,
                                    std::function<void()> landed) = 0;
  // The same into a bf16 compute copy (ModelBackend::compute_copy): the host's fp32 weights
  // travel a piece at a time through `staging` (device memory of staging_count floats) and each
  // piece is cast into bf16_dst, rounded to nearest even, as the forward's cast pass rounds.
  // Calls that share `staging` run their pieces in order. A device without bf16 compute refuses.
  virtual void copy_to_compute_copy_async(void* bf16_dst, const float* host_src, size_t count,
                                          float* staging, size_t staging_count,
                                          std::function<void()> landed) = 0;
  // `count` fp32 values in device memory cast into a bf16 compute copy, rounded as above, in the
  // device's order (after the work issued before it). A device without bf16 compute refuses.
  virtual void cast_to_compute_copy(void* bf16_dst, const float* device_src, size_t count) = 0;
  // A streamed block's weights into its ring slot (schedule/weight_ring.h): `bytes` of host
  // memory (pinned on CUDA) into device memory once `after` has passed (null: at once), beside the
  // device's work and without waiting for work issued after the fence (on CUDA on a copy stream);
  // returns a fence that passes once the copy has landed. Nothing may write host_src or read
  // device_dst until then. The base copies on the calling thread, through copy_to_device.
  virtual std::shared_ptr<const DeviceFence> copy_to_device_after(const DeviceFence* after,
                                                                  void* device_dst,
                                                                  const void* host_src,
                                                                  size_t bytes);
  // `bytes` of device memory into host memory (pinned on CUDA) once `after` has passed, beside
  // the device's work and without waiting for work issued after the fence (on CUDA on the copy
  // stream to the host), and returns at once; `landed` (may be empty) runs once the copy is there
  // (on CUDA on CUDA's callback thread: it must not call CUDA, throw, or block for long). Copies
  // it starts land in the order they were started. Nothing may write device_src or read host_dst
  // until then. The base waits for the fence and copies on the calling thread.
  virtual void copy_to_host_async(const DeviceFence& after, void* host_dst, const void* device_src,
                                  size_t bytes, std::function<void()> landed);
  // Device work issued after this call, by any thread, starts only once `fence` has passed (on
  // CUDA the compute stream waits for it; the base waits on the calling thread).
  virtual void order_after(const DeviceFence& fence) { wait_for(fence); }
  virtual void fill_zero(float* device_dst, size_t count) = 0;
  // device_dst[i] += device_src[i]: one float add per element, so the sum of micro-batch
  // gradients rounds the same on every device and in every mode.
  virtual void add(float* device_dst, const float* device_src, size_t count) = 0;

  // Sum of squares of x, bitwise reproducible run to run (see optim/grad_norm.h).
  virtual double sum_of_squares(const float* x, size_t count) = 0;
  // The same sum, started after all device work issued so far without waiting for it: *result
  // (host memory from allocate_host) holds sum_of_squares' bits once a fence issued after this
  // call has passed. A schedule takes a gradient's norm where the gradient lies, so the host does
  // not read it a second time for that.
  virtual void start_sum_of_squares(const float* x, size_t count, double* result) = 0;
  // The sums of squares of chunks [first_chunk, end_chunk) of `x` (device memory, `count`
  // elements) into chunk_sums[first_chunk, end_chunk) on the host, after the work issued before:
  // optim/grad_norm.h's chunks (ZeRO-1's norm, each rank its shard's). The CPU's bits there; a
  // GPU groups each chunk's additions its own way.
  virtual void chunk_sums_of_squares(const float* x, size_t count, size_t first_chunk,
                                     size_t end_chunk, double* chunk_sums) = 0;

  // AdamW on one span, weight decay per tensor as the layout says (see optim/adamw.h).
  // bf16_weights, when not null, is device memory laid out like the span in bfloat16 (16 bits
  // each): the same pass also writes the new weights there, rounded to nearest even. That is the
  // compute copy a bf16 forward reads (ModelBackend::compute_copy), which then needs no cast pass
  // of its own. A device without bf16 compute refuses it.
  virtual void adamw_update_span(const ParameterLayout& layout, const Span& span, float* params,
                                 const float* grads, float* m, float* v, const AdamWStep& step,
                                 void* bf16_weights) = 0;
  // AdamW on elements [first, first + count) of one span, the buffers starting at element
  // `first` (optim/adamw.h's adamw_update_span_part): a rank's part of the optimizer state. The
  // base refuses: only the CPU device implements it for now.
  // Data parallel on this device's memory (docs/parallel.md): rank 0 makes an id and hands it to
  // every rank, which then joins the others with it (all at once). The base has no collectives of
  // its own: the CPU backend sums in host memory, through comm/.
  virtual std::vector<uint8_t> new_collectives_id();
  virtual std::unique_ptr<DeviceCollectives> join_collectives(const std::vector<uint8_t>& id,
                                                              int rank, int ranks);
  virtual void adamw_update_span_part(const ParameterLayout& layout, const Span& span, size_t first,
                                      size_t count, float* params, const float* grads, float* m,
                                      float* v, const AdamWStep& step);

  // adamw_update_span with the moments in the run's optimizer state kind (optim/adamw_moments.h:
  // fp32, bf16, or 8-bit codes and block scales, all in this device's memory, laid out from the
  // span's first element), in place. Every device gives the CPU's scalar loop's bits
  // (optim/adamw_state.h), so modes that update a span on different devices agree. The base
  // updates fp32 moments through adamw_update_span and refuses the other kinds.
  virtual void adamw_update_span_state(const ParameterLayout& layout, const Span& span,
                                       float* params, const float* grads,
                                       const AdamWMoments& moments, const AdamWStep& step,
                                       void* bf16_weights);
  // adamw_update_span_part in any kind, the moments starting at element `first`, which must
  // start an 8-bit block (check_state_part; otherwise layup::Error); `bf16_weights` (may be null)
  // receives the part's new weights rounded to bf16. The base updates fp32 moments through
  // adamw_update_span_part and refuses the other kinds and a bf16 copy.
  virtual void adamw_update_span_part_state(const ParameterLayout& layout, const Span& span,
                                            size_t first, size_t count, float* params,
                                            const float* grads, const AdamWMoments& moments,
                                            const AdamWStep& step, void* bf16_weights);

 protected:
  // A null accountant gives the device a ledger of its own.
  explicit Device(std::shared_ptr<MemoryAccountant> accountant);
  // What allocate_kind hands its DeviceBuffer: `count` floats of `tensor_class` in the ledger.
  MemoryRecord record(size_t count, TensorClass tensor_class, MemorySide side,
                      MemoryKind kind) const;

 private:
  std::shared_ptr<MemoryAccountant> accountant_;
};

// The CPU backend's device; it records into `accountant` (null: a ledger of its own).
std::unique_ptr<Device> make_cpu_device(std::shared_ptr<MemoryAccountant> accountant = nullptr);

}  // namespace layup
