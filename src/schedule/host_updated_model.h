// The model as the planned schedule keeps it (every mode composes it): the compute copy of the
// weights in the device's memory (what forward and backward read), and on the host the fp32 master
// weights, the gradient accumulated over micro-batches and the AdamW moments of the spans the host
// updates (every span in offload; in layup those ScheduleOptions::update_sites leaves on the host;
// none in gpu, whose device copy is then the master weights and which has no host state and no
// CPU workers), packed in layout order (PackedSpans; the moments in the run's optimizer state
// kind, PackedMoments). A span's state is read and written span by span
// (export_span, import_span); the device copy is refreshed from it after each update
// (update_span). What it allocates with which ScheduleOptions is listed by buffers(); what the
// options mean (weights in place, no host gradient, speculative clipping, weights landing in the
// compute copy) is written once in docs/schedules.md.
//
// The CPU side runs on one engine, HostAdamW (optim/host_adamw.h), whose pinned workers split
// every pass over a span (adding a gradient into the accumulator, its sum of squares, AdamW), so a
// span's update uses every worker however the schedule orders spans. The schedules decide how a
// step's gradient reaches the host and when each span is updated.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optim/host_adamw.h"
#include "schedule/disk_tier.h"
#include "schedule/host_gradient.h"
#include "schedule/optimizer_shards.h"
#include "schedule/packed_moments.h"
#include "schedule/packed_spans.h"
#include "schedule/schedule.h"
#include "schedule/span_square_sums.h"
#include "schedule/staged_tier.h"
#include "schedule/weight_ring.h"

namespace layup {

class HostUpdatedModel {
 public:
  // cpu_workers (options): HostAdamW workers, one per core from the first allowed one (0: every
  // core this process may use).
  // master_on_device (gpu, where no span is updated on the host): the device's copy is the master
  // weights, placed and listed as the master weights' class.
  HostUpdatedModel(std::unique_ptr<ModelBackend> backend, std::unique_ptr<Device> device,
                   const ParameterLayout& layout, const ScheduleOptions& options,
                   bool master_on_device = false);

  ModelBackend& backend() const { return *backend_; }
  Device& device() const { return *device_; }
  // The device's fp32 copy (device_copy_spans), packed; device_copy_at(index) is a span's place.
  float* device_copy() const { return params_.data(); }
  bool weights_in_place() const { return weights_in_place_; }
  bool weights_land_in_compute_copy() const { return weights_land_in_compute_copy_; }
  bool speculative_clip() const { return speculative_clip_; }
  // The gradient accumulated over micro-batches (null without ScheduleOptions::host_gradient):
  // every host-updated span's, or (layer-major accumulation without a whole gradient) the
  // host-updated head spans' only.
  HostGradient* host_gradient() const { return host_gradient_.get(); }
  // The spans at UpdateSite::kDisk (null where there are none).
  DiskTier* disk_tier() const { return disk_tier_.get(); }
  // Whether span `index` is staged through the device (UpdateSite::kStaged): its update_span runs
  // the device's AdamW, beside the CPU's updates of other spans.
  bool staged(size_t index) const { return staged_tier_ && staged_tier_->holds(index); }
  // Returns once no staged span's state is on its way back to the host.
  void wait_for_staged() const {
    if (staged_tier_) staged_tier_->wait_idle();
  }
  // The ring the streamed blocks compute from (null where none is streamed), and where a streamed
  // span's fill reads its weights: the current fp32 master weights, or a copy in pinned host
  // memory (stream_copy_spans), which the host update writes when the block's new weights are
  // there (before it reports them landed).
  WeightRing* weight_ring() const { return ring_.get(); }
  bool streams(size_t index) const { return ring_ && ring_->streams(index); }
  const void* stream_source(size_t index) const;

  // The host-updated spans' state from the host (a disk span's from the disk); the weights of
  // every span into the device's copy. The caller waits first for updates still in flight.
  void export_span(size_t index, const SpanState& out) const;
  void import_span(size_t index, const ConstSpanState& in);
  std::string cpu_adamw_report() const { return host_adamw_ ? host_adamw_->report() : ""; }
  double cpu_adamw_rate() const { return host_adamw_ ? host_adamw_->rate_params_per_s() : 0.0; }
  std::string storage_report() const {
    return disk_tier_ ? "disk tier: " + disk_tier_->describe() : "";
  }
  DiskTraffic disk_traffic() const { return disk_tier_ ? disk_tier_->traffic() : DiskTraffic{}; }
  // Records its AdamW spans on the track the caller gives update_span, the weight copies to the
  // device on "to device" and one track per HostAdamW worker ("cpu worker 0", ...) with its share
  // of every AdamW.
  void set_trace(TraceRecorder* recorder);

  // What it allocates with `options` on a device handing out `kinds` (the HostGradient's too).
  struct Buffers {
    PlannedAllocation master, moments, span_sums;
    // The device's fp32 copy (none with weights_in_place; with weights_land_in_compute_copy, of
    // the device-updated spans only) and the staging the landing casts through.
    std::optional<PlannedAllocation> weights, landing_staging;
    std::optional<PlannedAllocation> spare_master, spare_moments;  // speculative_clip
    std::optional<PlannedAllocation> ring;                         // streamed_blocks
    // The host copy the streamed blocks of stream_copy_spans fill from.
    std::optional<PlannedAllocation> stream_host;
    std::optional<HostGradient::Buffers> gradient;  // host_gradient
    BufferList disk_staging;    // the disk tier's slots (spans at UpdateSite::kDisk)
    BufferList device_staging;  // the staged spans' slots on the device (UpdateSite::kStaged)
    BufferList list() const;
  };
  static Buffers buffers(const ParameterLayout& layout, const ScheduleOptions& options,
                         DeviceKinds kinds, bool master_on_device = false);

  // The spans whose state the host keeps (the host's and the staged ones); those whose gradient
  // the host accumulates (the host's, the disk's and the staged ones: every span the device does
  // not keep); and those the device keeps an fp32 copy of (a streamed
  // block none: it computes from the ring).
  static PackedSpans host_spans(const ParameterLayout& layout, const ScheduleOptions& options);
  static PackedSpans cpu_spans(const ParameterLayout& layout, const ScheduleOptions& options);
  // The spans host_gradient() keeps.
  static PackedSpans gradient_spans(const ParameterLayout& layout, const ScheduleOptions& options);
  static PackedSpans device_copy_spans(const ParameterLayout& layout,
                                       const ScheduleOptions& options);
  // Per span whether it is streamed from a host copy of its own (in the ring's element type):
  // every streamed span where weights land in the bf16 compute copy, else the streamed disk spans
  // (the others' fills read their master weights).
  static std::vector<char> stream_copy_spans(const ParameterLayout& layout,
                                             const ScheduleOptions& options);
  // The moments of host_spans in the run's optimizer state kind (ZeRO-1: this rank's part of each).
  static PackedMoments host_moments(const ParameterLayout& layout, const ScheduleOptions& options);
  // ZeRO-1 of the host's state (ScheduleOptions::optimizer_shards > 1 and some span updated on
  // the host or on disk): each rank keeps the whole fp32 master weights (the device computes with
  // them, and a gather of each span's new weights keeps them equal) and its part of every host
  // span's moments; its disk tier likewise each disk span's whole master weights and its part of
  // the moments.
  static std::optional<OptimizerShards> host_shards(const ParameterLayout& layout,
                                                    const ScheduleOptions& options);
  // The bytes of the disk tier's file on this rank (0 without disk spans): with ZeRO-1 each rank's
  // file holds every disk span's whole master weights and its part of their moments; where the
  // rank is not known yet (a plan), the largest rank's.
  static size_t disk_bytes(const ParameterLayout& layout, const ScheduleOptions& options);
  bool sharded() const { return shards_.has_value(); }

  // The weights the device computes with, span by span: its own copy; or the master weights in
  // place; or, for a span whose weights land in the compute copy, the master weights, which the
  // backend then never reads; a streamed block's ring slot.
  ParameterPointers device_params() const;

  // Starts the sum of squares of span `index`'s gradient in device memory, in order with the
  // device's work (Device::start_sum_of_squares); device_sum_of_squares reads it once a fence
  // issued after this call has passed. Call from the thread that issues the device's work.
  void start_device_sum_of_squares(size_t index, const float* device_grad);
  // That sum; each read consumes it (a sum read twice, or never started for this step, reads NaN:
  // a step that is not applied, which tests see, rather than an old step's norm).
  double device_sum_of_squares(size_t index);

  // One copy of the host's optimizer state: master weights and AdamW moments of the host-updated
  // spans, packed (host_spans; the moments as host_moments lays them out).
  struct OptimizerState {
    float* params;
    float* moments;
  };
  // The state export_span returns and (with weights_in_place) the device computes with.
  OptimizerState current_state() { return {host_params_.data(), host_moments_buffer_.data()}; }
  // The second copy ScheduleOptions::speculative_clip keeps: a speculative step writes its new
  // state there, leaving the current one to redo the step from.
  OptimizerState spare_state();
  // The spare copy becomes the current state (and the current one the spare), for a step that
  // wrote every span's new state into it. Updates already handed their OptimizerStates keep them.
  void promote_spare_state();

  // AdamW on span `index` with its gradient `grads` (host-readable, laid out like the span: the
  // accumulator's HostGradient::span, or the gradient where it lies), reading the state in `from`
  // and writing the new state into `to` (the same state: in place; or the spare copy; a disk
  // span's state comes from the disk tier's staging and goes back to disk instead), split over
  // the HostAdamW workers and traced as "adamw ..." on trace_track; then starts the transfer of the
  // span's new weights (from `to`) to the device and returns. A staged span's update runs on the
  // device instead (StagedTier::update: its gradient and state copied into a staging slot, the
  // device's AdamW, the new state copied back into `to`), returning once the gradient and `from`
  // are read; `landed` then runs once its new state is on the host, and one thread may update
  // staged spans while another updates the others. `landed` runs when they are there
  // (on whatever thread Device::copy_to_device_async says; it must not block or throw), or at once
  // with weights_in_place. One thread at a time may call it (the landing staging is shared); the
  // caller must not let anything read the span's device weights before `landed`.
  void update_span(size_t index, const float* grads, const OptimizerState& from,
                   const OptimizerState& to, const AdamWStep& adamw, int trace_track,
                   std::function<void()> landed);
  // In place, on the current state.
  void update_span(size_t index, const float* grads, const AdamWStep& adamw, int trace_track,
                   std::function<void()> landed) {
    update_span(index, grads, current_state(), current_state(), adamw, trace_track,
                std::move(landed));
  }

  // ZeRO-1: AdamW on this rank's part of span `index` (in place, `grads` laid out like the span,
  // this rank's part summed over the ranks), then every rank's new weights gathered into the
  // master weights (MPI: the caller's thread is the only one calling the communicator) and sent
  // to the device. A disk span's state is taken into a staging slot for it and written back.
  // Every rank calls it for the same spans in the same order (disk spans: the order given to
  // DiskTier::expect).
  void update_span_part(size_t index, const float* grads, const AdamWStep& adamw, int trace_track);
  // ZeRO-1, a rank other than 0 (Schedule::serve_exports): its part of span `index`'s moments to
  // rank 0, which asked for them in export_span.
  void send_moments(size_t index) const;

  // Span `index`'s weights on the device from the current master weights, in order with the
  // device's work, returning when they are there (nothing to do with weights_in_place).
  void refresh_device_weights(size_t index);
  // The same from `weights` (host memory laid out like the span): the device copy where the span
  // has one, and the compute copy where weights land there.
  void send_weights_now(size_t index, const float* weights);

  // Data parallel: the ranks this step's gradients are summed over (null: this process alone),
  // and their count.
  Communicator* ranks() const { return ranks_; }
  int rank_count() const { return ranks_ != nullptr ? ranks_->size() : 1; }
  // Span `index`'s gradient in the host accumulator, complete on this rank, summed over the ranks
  // (HostGradient::sum_over_ranks); returns the sum's sum of squares. Every rank calls it for the
  // same spans in the same order, one thread at a time.
  // ZeRO-1: summed into this rank's part only (HostGradient::reduce_scatter), the same sum of
  // squares.
  double sum_gradient_over_ranks(size_t index) {
    if (shards_) return host_gradient_->reduce_scatter(index, *ranks_, *shards_);
    return host_gradient_->sum_over_ranks(index, *ranks_);
  }

  // The span's offset in the host's packed state, and in the device's fp32 copy.
  size_t host_at(size_t index) const;
  size_t device_copy_at(size_t index) const;

 private:
  // With a trace, each HostAdamW worker's share of one span's AdamW on its own track, under the
  // span's AdamW name (`hook`, handed to HostAdamW; it refers to this object).
  struct WorkerShares {
    WorkerShares(const HostUpdatedModel& model, const Span& span);
    WorkerShares(const WorkerShares&) = delete;
    WorkerShares& operator=(const WorkerShares&) = delete;
    std::vector<double> starts_us;
    std::string name;
    HostAdamW::ShareHook hook;
  };

  void update_staged_span(size_t index, const float* grads, const OptimizerState& from,
                          const OptimizerState& to, const AdamWStep& adamw, int trace_track,
                          std::function<void()> landed);
  // ZeRO-1's export of span `index`'s moments, rank 0 asking each owner for its part.
  void export_moment_parts(size_t index, const SpanState& out) const;
  // ZeRO-1's import: this rank's part of span `index`'s moments from the whole span's `in`.
  void import_moment_part(size_t index, const ConstSpanState& in);
  // ZeRO-1: this rank's part of disk span `index`'s moments, packed (coded from its first
  // element, as the host's parts are and send_moments sends them).
  std::vector<float> read_disk_moments(size_t index) const;
  // The disk tier's staging slots and store buffers on this rank (disk_bytes says why "this").
  static BufferList disk_staging(const ParameterLayout& layout, const ScheduleOptions& options,
                                 DeviceKinds kinds);

  const ParameterLayout layout_;
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<Device> device_;
  // ScheduleOptions
  const bool weights_in_place_, speculative_clip_, weights_land_in_compute_copy_;
  const PackedSpans host_spans_, cpu_spans_, device_copy_spans_;
  const PackedMoments host_moments_;  // where each host span's moments lie in a state's buffer
  DeviceBuffer params_;               // the device's fp32 copy (device_copy_spans_)
  DeviceBuffer landing_staging_;      // with weights_land_in_compute_copy
  // fp32 master weights (pinned on CUDA unless placed otherwise) and the AdamW moments (plain
  // host memory unless placed otherwise) of the host-updated spans, packed.
  DeviceBuffer host_params_;
  DeviceBuffer host_moments_buffer_;
  // The spare copy of master weights and moments, with speculative_clip only.
  DeviceBuffer spare_params_, spare_moments_;
  std::unique_ptr<HostAdamW> host_adamw_;
  Communicator* const ranks_;  // ScheduleOptions::ranks where several train; else null
  const std::optional<OptimizerShards> shards_;  // ZeRO-1 of the host's state (host_shards)
  // Per span, the sum of squares the device took of its gradient (start_device_sum_of_squares).
  SpanSquareSums device_sums_;
  // It reads device_sums_ but does not touch it when it goes.
  std::unique_ptr<HostGradient> host_gradient_;
  std::unique_ptr<DiskTier> disk_tier_;
  std::unique_ptr<StagedTier> staged_tier_;
  std::unique_ptr<WeightRing> ring_;
  // The streamed spans' copy their fills read (stream_copy_spans; pinned), block after block in
  // layout order (stream_host_at_: a span's first element, kNoStreamCopy for the others).
  static constexpr size_t kNoStreamCopy = static_cast<size_t>(-1);
  DeviceBuffer stream_host_;
  std::vector<size_t> stream_host_at_;
  bool has_stream_copy(size_t index) const;
  // Writes span `index`'s copy on the host from its fp32 `weights` (in bf16 rounded to nearest
  // even, as the device's cast rounds), where it has one.
  void write_stream_copy(size_t index, const float* weights);
  TraceRecorder* trace_ = nullptr;
  int to_device_track_ = 0;         // "to device" in trace_
  std::vector<int> worker_tracks_;  // "cpu worker i" in trace_, per HostAdamW worker
};

}  // namespace layup
