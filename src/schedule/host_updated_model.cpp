// HostUpdatedModel: the state and the operations `offload` and `layup` share.
#include "schedule/host_updated_model.h"

#include <algorithm>
#include <future>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"
#include "memory/parallel_pages.h"
#include "optim/adamw_moments.h"
#include "schedule/step_plan.h"
#include "trace/trace_recorder.h"

namespace layup {

namespace {

// The landing's staging (weights_land_in_compute_copy): 64 MiB, pieces long enough to run at the
// interconnect's full rate, and small beside the weights they save.
constexpr size_t kLandingStagingFloats = size_t{16} << 20;

UpdateSite site_of(const ScheduleOptions& options, size_t index) {
  return options.update_sites.empty() ? UpdateSite::kHost : options.update_sites[index];
}
// The host's store keeps the state of the spans the CPU updates and of the staged ones.
bool on_host(const ScheduleOptions& options, size_t index) {
  const UpdateSite site = site_of(options, index);
  return site == UpdateSite::kHost || site == UpdateSite::kStaged;
}
bool on_cpu(const ScheduleOptions& options, size_t index) {
  return site_of(options, index) != UpdateSite::kDevice;
}
bool any_on_disk(const ScheduleOptions& options) {
  return std::find(options.update_sites.begin(), options.update_sites.end(), UpdateSite::kDisk) !=
         options.update_sites.end();
}

// The ranks whose disk tier a run of `options` plans (one unless sharded): this process's where
// the ranks are known; else (a plan of ZeRO-1: `layup memory --ranks N`) every rank, the plan
// taking the largest, as host_moments does. Their records differ in their part of the moments.
std::vector<int> planned_disk_ranks(const ScheduleOptions& options,
                                    const std::optional<OptimizerShards>& shards) {
  if (!shards) return {0};
  if (options.ranks != nullptr) return {options.ranks->rank()};
  std::vector<int> ranks(static_cast<size_t>(options.optimizer_shards));
  for (size_t rank = 0; rank < ranks.size(); ++rank) ranks[rank] = static_cast<int>(rank);
  return ranks;
}

// Before anything reads the sites span by span.
void check_update_sites(const ParameterLayout& layout, const ScheduleOptions& options) {
  LAYUP_CHECK(options.update_sites.empty() || options.update_sites.size() == layout.spans().size(),
              "the update sites name ", options.update_sites.size(), " spans, but the model has ",
              layout.spans().size(), " (the embeddings, one per block, the final norm)");
}

}  // namespace

PackedSpans HostUpdatedModel::host_spans(const ParameterLayout& layout,
                                         const ScheduleOptions& options) {
  check_update_sites(layout, options);
  return PackedSpans::of(layout, [&](size_t index) { return on_host(options, index); });
}

PackedSpans HostUpdatedModel::cpu_spans(const ParameterLayout& layout,
                                        const ScheduleOptions& options) {
  check_update_sites(layout, options);
  return PackedSpans::of(layout, [&](size_t index) { return on_cpu(options, index); });
}

PackedSpans HostUpdatedModel::gradient_spans(const ParameterLayout& layout,
                                             const ScheduleOptions& options) {
  if (options.host_gradient) return cpu_spans(layout, options);
  // Layer-major without a whole gradient: the host still sums the head's micro-batches (the
  // device would need a head-sized sum of its own; blocks are summed in their slots).
  const size_t last = layout.spans().size() - 1;
  const bool layer_major = options.accumulation == Accumulation::kLayerMajor;
  return PackedSpans::of(layout, [&](size_t index) {
    return layer_major && (index == 0 || index == last) && on_cpu(options, index);
  });
}

std::vector<char> HostUpdatedModel::stream_copy_spans(const ParameterLayout& layout,
                                                      const ScheduleOptions& options) {
  std::vector<char> copied =
      WeightRing::streamed_spans(layout, options.update_sites, options.streamed_blocks);
  // Without a bf16 copy of all of them, the fills read the master weights, which a disk span
  // keeps only on disk: those get an fp32 copy.
  if (!options.weights_land_in_compute_copy)
    for (size_t index = 0; index < copied.size(); ++index)
      copied[index] = copied[index] && site_of(options, index) == UpdateSite::kDisk;
  return copied;
}

PackedSpans HostUpdatedModel::device_copy_spans(const ParameterLayout& layout,
                                                const ScheduleOptions& options) {
  check_update_sites(layout, options);
  const std::vector<char> streamed =
      WeightRing::streamed_spans(layout, options.update_sites, options.streamed_blocks);
  return PackedSpans::of(layout, [&](size_t index) {
    if (streamed[index]) return false;
    // A disk span has no master weights in host memory to compute with in place.
    if (options.weights_in_place) return site_of(options, index) == UpdateSite::kDisk;
    return !options.weights_land_in_compute_copy || !on_cpu(options, index);
  });
}

std::optional<OptimizerShards> HostUpdatedModel::host_shards(const ParameterLayout& layout,
                                                             const ScheduleOptions& options) {
  if (options.optimizer_shards <= 1 || cpu_spans(layout, options).count == 0) return std::nullopt;
  return optimizer_shards(layout, options.optimizer_shards);
}

size_t HostUpdatedModel::disk_bytes(const ParameterLayout& layout, const ScheduleOptions& options) {
  if (!any_on_disk(options)) return 0;
  const std::optional<OptimizerShards> shards = host_shards(layout, options);
  size_t largest = 0;
  for (const int rank : planned_disk_ranks(options, shards))
    largest = std::max(largest, disk_state_bytes(DiskTier::records(
                                    layout, options.update_sites, options.optimizer_state,
                                    shards ? &*shards : nullptr, rank)));
  return largest;
}

BufferList HostUpdatedModel::disk_staging(const ParameterLayout& layout,
                                          const ScheduleOptions& options, DeviceKinds kinds) {
  if (!any_on_disk(options)) return {};
  const std::optional<OptimizerShards> shards = host_shards(layout, options);
  const auto bytes_of = [](const BufferList& list) {
    size_t bytes = 0;
    for (const PlannedAllocation& buffer : list) bytes += buffer.bytes;
    return bytes;
  };
  BufferList largest;
  for (const int rank : planned_disk_ranks(options, shards)) {
    BufferList staging =
        DiskTier::buffers(layout, options.update_sites, static_cast<size_t>(options.disk_slots),
                          kinds, options.optimizer_state, shards ? &*shards : nullptr, rank);
    if (largest.empty() || bytes_of(staging) > bytes_of(largest)) largest = std::move(staging);
  }
  return largest;
}

PackedMoments HostUpdatedModel::host_moments(const ParameterLayout& layout,
                                             const ScheduleOptions& options) {
  check_update_sites(layout, options);
  const std::optional<OptimizerShards> shards = host_shards(layout, options);
  if (!shards)
    return PackedMoments::of(options.optimizer_state, layout,
                             [&](size_t index) { return on_host(options, index); });
  // ZeRO-1: this rank's part of each host span. The shards are the same on every rank, so where
  // the rank is not known yet (a plan) the largest is what the plan lists.
  auto of_rank = [&](int rank) {
    std::vector<size_t> counts(layout.spans().size(), 0);
    for (size_t index = 0; index < counts.size(); ++index)
      if (on_host(options, index)) counts[index] = shards->part(layout.spans()[index], rank).count;
    return PackedMoments::of_counts(options.optimizer_state, std::move(counts));
  };
  if (options.ranks != nullptr) return of_rank(options.ranks->rank());
  PackedMoments largest = of_rank(0);
  for (int rank = 1; rank < options.optimizer_shards; ++rank) {
    PackedMoments moments = of_rank(rank);
    if (moments.bytes > largest.bytes) largest = std::move(moments);
  }
  return largest;
}

HostUpdatedModel::Buffers HostUpdatedModel::buffers(const ParameterLayout& layout,
                                                    const ScheduleOptions& options,
                                                    DeviceKinds kinds, bool master_on_device) {
  const PackedSpans host = host_spans(layout, options);
  const PackedMoments moments = host_moments(layout, options);
  const PackedSpans device_copy = device_copy_spans(layout, options);
  LAYUP_CHECK(!master_on_device || cpu_spans(layout, options).count == 0,
              "internal error: the device's copy is the master weights, and the host updates "
              "spans from master weights of its own");
  auto host_state = [&](TensorClass tensor_class, std::string what) {
    return placed_buffer(
        options, kinds,
        tensor_class == TensorClass::kOptimizerMoments ? moments.floats() : host.count,
        tensor_class, MemorySide::kHost, std::move(what));
  };
  const std::string kind = name_of(options.optimizer_state);
  Buffers buffers;
  buffers.master = host_state(TensorClass::kMasterWeights,
                              options.weights_in_place
                                  ? "fp32 master weights (the device computes with them in place)"
                                  : "fp32 master weights");
  std::string moments_what = "AdamW m and v, " + kind;
  if (host_shards(layout, options))
    moments_what +=
        ", this rank's shard of " + std::to_string(options.optimizer_shards) + " (ZeRO-1)";
  buffers.moments = host_state(TensorClass::kOptimizerMoments, std::move(moments_what));
  buffers.span_sums = SpanSquareSums::buffer(layout.spans().size(), kinds);
  if (master_on_device)
    buffers.weights =
        placed_buffer(options, kinds, device_copy.count, TensorClass::kMasterWeights,
                      MemorySide::kDevice, "fp32 weights: read by forward, updated by AdamW");
  else if (device_copy.count > 0)
    buffers.weights = placed_buffer(
        options, kinds, device_copy.count, TensorClass::kWeights, MemorySide::kDevice,
        options.weights_land_in_compute_copy ? "fp32 weights of the device-updated spans"
                                             : "fp32 copy of the weights the device computes with");
  if (options.weights_land_in_compute_copy) {
    // Every span's weights land through it when they are imported, the device-updated ones too.
    size_t largest = 0;
    for (const Span& span : layout.spans()) largest = std::max(largest, span.count);
    buffers.landing_staging = PlannedAllocation{
        MemorySide::kDevice, TensorClass::kWeights, kinds.own,
        std::min(largest, kLandingStagingFloats) * sizeof(float),
        "staging of host-updated weights on their way into the bf16 compute copy"};
  }
  if (options.speculative_clip) {
    buffers.spare_master =
        host_state(TensorClass::kMasterWeights,
                   "spare fp32 master weights (speculative clipping writes the new state here)");
    buffers.spare_moments =
        host_state(TensorClass::kOptimizerMoments, "spare AdamW m and v, " + kind);
  }
  buffers.ring = WeightRing::buffer(layout, options, kinds);
  const std::vector<char> copied = stream_copy_spans(layout, options);
  const size_t copied_blocks = static_cast<size_t>(std::count(copied.begin(), copied.end(), 1));
  const size_t element_bytes = WeightRing::element_bytes(options);
  if (buffers.ring && copied_blocks > 0)
    buffers.stream_host = PlannedAllocation{
        MemorySide::kHost, TensorClass::kWeights, kinds.host_copy,
        (copied_blocks * layout.block().count * element_bytes + 3) / 4 * 4,
        std::string(element_bytes == 2 ? "bf16" : "fp32") + " weights of the streamed blocks" +
            (options.weights_land_in_compute_copy ? "" : " on disk") +
            ", the source of their fills (written by the host update, or a staged block's "
            "device AdamW)"};
  if (const PackedSpans summed = gradient_spans(layout, options); summed.count > 0)
    buffers.gradient = HostGradient::buffers(layout, summed, kinds);
  buffers.disk_staging = disk_staging(layout, options, kinds);
  buffers.device_staging = StagedTier::buffers(layout, options, kinds);
  return buffers;
}

BufferList HostUpdatedModel::Buffers::list() const {
  BufferList list;
  // No host state where no span is updated on the host.
  for (const PlannedAllocation& buffer : {master, moments})
    if (buffer.bytes > 0) list.push_back(buffer);
  list.push_back(span_sums);
  for (const std::optional<PlannedAllocation>& buffer :
       {weights, landing_staging, spare_master, spare_moments, ring, stream_host})
    if (buffer) list.push_back(*buffer);
  if (gradient) append(list, gradient->list());
  append(list, disk_staging);
  append(list, device_staging);
  return list;
}

HostUpdatedModel::HostUpdatedModel(std::unique_ptr<ModelBackend> backend,
                                   std::unique_ptr<Device> device, const ParameterLayout& layout,
                                   const ScheduleOptions& options, bool master_on_device)
    : layout_(layout),
      backend_(std::move(backend)),
      device_(std::move(device)),
      weights_in_place_(options.weights_in_place),
      speculative_clip_(options.speculative_clip),
      weights_land_in_compute_copy_(options.weights_land_in_compute_copy),
      host_spans_(host_spans(layout, options)),
      cpu_spans_(cpu_spans(layout, options)),
      device_copy_spans_(device_copy_spans(layout, options)),
      host_moments_(host_moments(layout, options)),
      ranks_(options.ranks != nullptr && options.ranks->size() > 1 ? options.ranks : nullptr),
      shards_(host_shards(layout, options)),
      device_sums_(*device_, layout.spans().size()) {
  if (shards_) {
    LAYUP_CHECK(ranks_ != nullptr && ranks_->size() == options.optimizer_shards,
                "internal error: the run was planned for ", options.optimizer_shards, " ranks but ",
                rank_count(), " run it");
    // Every host span is updated once the norm is known, on the thread that gathers its weights.
    LAYUP_CHECK(!speculative_clip_,
                "ZeRO-1 (the moments split across the ranks) updates the host's spans once the "
                "norm is known; use --layup-clip deferred");
  }
  LAYUP_CHECK(ranks_ == nullptr || options.host_gradient || cpu_spans_.count == 0,
              "internal error: several ranks sum each span's gradient on the host, and this "
              "schedule keeps none there (ScheduleOptions::host_gradient)");
  LAYUP_CHECK(options.cpu_workers >= 0, "--cpu-workers must be at least 1 (got ",
              options.cpu_workers, ")");
  LAYUP_CHECK(!weights_in_place_ || cpu_spans_.count == layout.total_count(),
              "with the master weights in place every span must be updated on the host");
  LAYUP_CHECK(!any_on_disk(options) || !speculative_clip_,
              "speculative clipping keeps a second copy of the optimizer state, which blocks on "
              "disk do not have; clip with --layup-clip deferred");
  LAYUP_CHECK(!StagedTier::any(options) || !shards_,
              "blocks staged through the device (--optimizer-placement staged:S) update a whole "
              "block's state, and with ZeRO-1 each rank keeps only its part of it; keep their "
              "state on the host");
  LAYUP_CHECK(!StagedTier::any(options) || !any_on_disk(options),
              "blocks staged through the device (--optimizer-placement staged:S) and blocks on "
              "disk in one run are not supported yet; use one or the other");
  if (weights_land_in_compute_copy_) {
    LAYUP_CHECK(!weights_in_place_, "weights cannot both be in place and land in a compute copy");
    LAYUP_CHECK(backend_->compute_copy(0) != nullptr, "the ", backend_->name(),
                " backend keeps no bf16 copy of the weights for them to land in");
    // The compute copies are written where the weights change (update_span, import_span, the
    // device tier's AdamW), so no forward casts.
    backend_->set_compute_copies_current(true);
  }
  const Buffers listed = buffers(layout, options, device_->kinds(), master_on_device);
  if (listed.master.bytes > 0) host_params_ = device_->allocate(listed.master);
  if (listed.moments.bytes > 0) host_moments_buffer_ = device_->allocate(listed.moments);
  if (listed.weights) params_ = device_->allocate(*listed.weights);
  if (listed.landing_staging) landing_staging_ = device_->allocate(*listed.landing_staging);
  if (listed.spare_master) {
    spare_params_ = device_->allocate(*listed.spare_master);
    spare_moments_ = device_->allocate(*listed.spare_moments);
  }
  // The CPU workers only where the CPU updates spans or sums gradients.
  if (cpu_spans_.count > 0 || listed.gradient) {
    HostAdamWOptions adamw_options;
    adamw_options.workers = options.cpu_workers;
    host_adamw_ = std::make_unique<HostAdamW>(adamw_options);
  }
  if (listed.gradient)
    host_gradient_ = std::make_unique<HostGradient>(
        *device_, layout_, gradient_spans(layout_, options), *host_adamw_, device_sums_);
  if (listed.ring) ring_ = std::make_unique<WeightRing>(*device_, layout_, options);
  if (listed.stream_host) {
    stream_host_ = device_->allocate(*listed.stream_host);
    stream_host_at_.assign(layout.spans().size(), kNoStreamCopy);
    const std::vector<char> copied = stream_copy_spans(layout, options);
    size_t at = 0;
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      if (!copied[index]) continue;
      stream_host_at_[index] = at;
      at += layout.spans()[index].count;
    }
  }
  if (ring_ && weights_land_in_compute_copy_) {
    for (size_t index = 0; index < layout.spans().size(); ++index) {
      if (!ring_->streams(index)) continue;
      // The backend computes with the span's compute copy, which is its ring slot from now on.
      LAYUP_CHECK(backend_->place_compute_copy(index, ring_->slot(index)), "the ", backend_->name(),
                  " backend cannot compute a block from a ring slot");
    }
  }
  if (StagedTier::any(options))
    staged_tier_ = std::make_unique<StagedTier>(*device_, layout_, options);
  // Each rank keeps a tier and a file of its own (ZeRO-1: with its part of the moments).
  if (any_on_disk(options))
    disk_tier_ = std::make_unique<DiskTier>(
        *device_, layout_, options.update_sites, options.offload_dir,
        static_cast<size_t>(options.disk_slots), options.optimizer_state,
        shards_ ? &*shards_ : nullptr, ranks_ != nullptr ? ranks_->rank() : 0);
}

size_t HostUpdatedModel::host_at(size_t index) const {
  LAYUP_CHECK(host_spans_.holds(index), "span ", index, " is not updated on the host");
  return host_spans_.at[index];
}

size_t HostUpdatedModel::device_copy_at(size_t index) const {
  LAYUP_CHECK(device_copy_spans_.holds(index), "span ", index, " has no fp32 copy on the device");
  return device_copy_spans_.at[index];
}

ParameterPointers HostUpdatedModel::device_params() const {
  ParameterPointers pointers;
  for (size_t index = 0; index < layout_.spans().size(); ++index) {
    const Span& span = layout_.spans()[index];
    // A disk span without a device copy computes with its compute copy only. A streamed span
    // computes from its ring slot: here in fp32; where weights land in the compute copy the slot
    // is the span's compute copy (place_compute_copy) and the backend reads these never.
    const float* weights = streams(index) && !weights_land_in_compute_copy_
                               ? static_cast<const float*>(ring_->slot(index))
                           : device_copy_spans_.holds(index)
                               ? params_.data() + device_copy_spans_.at[index]
                           : host_spans_.holds(index) ? host_params_.data() + host_spans_.at[index]
                                                      : nullptr;
    if (span.kind == SpanKind::kEmbeddings)
      pointers.embeddings = weights;
    else if (span.kind == SpanKind::kBlock)
      pointers.blocks.push_back(weights);
    else
      pointers.final_norm = weights;
  }
  return pointers;
}

void HostUpdatedModel::set_trace(TraceRecorder* recorder) {
  trace_ = recorder;
  to_device_track_ = recorder != nullptr ? recorder->track("to device") : 0;
  if (ring_) ring_->set_trace(recorder, to_device_track_);
  worker_tracks_.clear();
  if (recorder != nullptr && host_adamw_)
    for (int worker = 0; worker < host_adamw_->worker_count(); ++worker)
      worker_tracks_.push_back(recorder->track("cpu worker " + std::to_string(worker)));
}

void HostUpdatedModel::export_span(size_t index, const SpanState& out) const {
  if (disk_tier_ && disk_tier_->holds(index)) {
    if (!shards_) return disk_tier_->read_span(index, out);
    // The whole weights from this rank's record, the moments part by part from their owners.
    disk_tier_->read_span(index, {out.params, nullptr, nullptr});
    return export_moment_parts(index, out);
  }
  const size_t count = layout_.spans()[index].count;
  const size_t at = host_at(index);
  if (out.params) copy_in_parallel(out.params, host_params_.data() + at, count);
  if (shards_) return export_moment_parts(index, out);
  const AdamWMoments moments = host_moments_.in(host_moments_buffer_.data(), index);
  if (out.coded != nullptr)
    return copy_moments(moments, AdamWMoments::in_buffer(moments.kind, out.coded, count), count);
  if (moments.kind != OptimizerStateKind::kFp32)
    return decode_moments(moments, count, out.m, out.v);
  if (out.m) copy_in_parallel(out.m, moments.m_fp32(), count);
  if (out.v) copy_in_parallel(out.v, moments.v_fp32(), count);
}

void HostUpdatedModel::export_moment_parts(size_t index, const SpanState& out) const {
  if (out.m == nullptr && out.v == nullptr && out.coded == nullptr) return;
  LAYUP_CHECK(ranks_->rank() == 0,
              "internal error: only rank 0 exports the optimizer state of a sharded run");
  const Span& span = layout_.spans()[index];
  const OptimizerStateKind kind = host_moments_.kind;
  // Each rank's part decoded from its first element: this rank's from its buffer or its disk
  // record, the others' asked of their owners.
  std::vector<float> received;
  for (int rank = 0; rank < rank_count(); ++rank) {
    const OptimizerShards::Part part = shards_->part(span, rank);
    if (part.count == 0) continue;
    float* packed = nullptr;
    if (rank == 0 && disk_tier_ && disk_tier_->holds(index)) {
      received = read_disk_moments(index);
      packed = received.data();
    } else if (rank == 0) {
      packed = host_moments_.base(host_moments_buffer_.data(), index);
    } else {
      received.resize(PackedMoments::padded_bytes(kind, part.count) / sizeof(float));
      const uint64_t request[4] = {kSendMoments, index, 0, 0};
      ranks_->send(request, 4, rank);
      ranks_->receive(received.data(), received.size(), rank);
      packed = received.data();
    }
    const AdamWMoments in_part = AdamWMoments::in_buffer(kind, packed, part.count);
    if (out.coded != nullptr)
      copy_moments(in_part, AdamWMoments::in_buffer(kind, out.coded, span.count).at(part.first),
                   part.count);
    else
      decode_moments(in_part, part.count, out.m ? out.m + part.first : nullptr,
                     out.v ? out.v + part.first : nullptr);
  }
}

void HostUpdatedModel::send_moments(size_t index) const {
  const bool on_disk = index < layout_.spans().size() && disk_tier_ && disk_tier_->holds(index);
  LAYUP_CHECK(shards_ && index < layout_.spans().size() &&
                  (host_moments_.holds(index) ||
                   (on_disk && shards_->part(layout_.spans()[index], ranks_->rank()).count > 0)),
              "internal error: rank 0 asked for moments this rank does not own");
  if (on_disk) {
    const std::vector<float> packed = read_disk_moments(index);
    return ranks_->send(packed.data(), packed.size(), 0);
  }
  ranks_->send(host_moments_.base(host_moments_buffer_.data(), index), host_moments_.floats(index),
               0);
}

std::vector<float> HostUpdatedModel::read_disk_moments(size_t index) const {
  const size_t count = disk_tier_->moment_count(index);
  std::vector<float> packed(PackedMoments::padded_bytes(host_moments_.kind, count) / sizeof(float));
  disk_tier_->read_moments(index, packed.data());
  return packed;
}

void HostUpdatedModel::import_span(size_t index, const ConstSpanState& in) {
  const size_t count = layout_.spans()[index].count;
  if (host_spans_.holds(index)) {
    const size_t at = host_spans_.at[index];
    copy_in_parallel(host_params_.data() + at, in.params, count);
    if (shards_) {
      import_moment_part(index, in);
    } else {
      const AdamWMoments moments = host_moments_.in(host_moments_buffer_.data(), index);
      if (in.coded != nullptr) {
        copy_moments(AdamWMoments::in_buffer(moments.kind, const_cast<void*>(in.coded), count),
                     moments, count);
      } else if (moments.kind != OptimizerStateKind::kFp32) {
        encode_moments(in.m, in.v, count, moments);  // coded from the span's first element
      } else {
        copy_in_parallel(moments.m_fp32(), in.m, count);
        copy_in_parallel(moments.v_fp32(), in.v, count);
      }
    }
  }
  if (disk_tier_ && disk_tier_->holds(index)) disk_tier_->write_span(index, in);
  send_weights_now(index, in.params);
}

void HostUpdatedModel::import_moment_part(size_t index, const ConstSpanState& in) {
  const Span& span = layout_.spans()[index];
  const OptimizerShards::Part part = shards_->part(span, ranks_->rank());
  if (part.count == 0) return;
  const AdamWMoments moments = host_moments_.in(host_moments_buffer_.data(), index);
  if (in.coded != nullptr)
    copy_moments(AdamWMoments::in_buffer(moments.kind, const_cast<void*>(in.coded), span.count)
                     .at(part.first),
                 moments, part.count);
  else  // coded from the part's first element, as its updates code it
    encode_moments(in.m + part.first, in.v + part.first, part.count, moments);
}

void HostUpdatedModel::start_device_sum_of_squares(size_t index, const float* device_grad) {
  device_sums_.start(index, device_grad, layout_.spans()[index].count);
}

double HostUpdatedModel::device_sum_of_squares(size_t index) {
  return device_sums_.take(index);
}

HostUpdatedModel::OptimizerState HostUpdatedModel::spare_state() {
  LAYUP_CHECK(speculative_clip_, "this schedule keeps no spare optimizer state");
  return {spare_params_.data(), spare_moments_.data()};
}

void HostUpdatedModel::promote_spare_state() {
  LAYUP_CHECK(speculative_clip_, "this schedule keeps no spare optimizer state");
  std::swap(host_params_, spare_params_);
  std::swap(host_moments_buffer_, spare_moments_);
}

void HostUpdatedModel::refresh_device_weights(size_t index) {
  send_weights_now(index, host_params_.data() + host_at(index));
}

bool HostUpdatedModel::has_stream_copy(size_t index) const {
  return !stream_host_at_.empty() && stream_host_at_[index] != kNoStreamCopy;
}

const void* HostUpdatedModel::stream_source(size_t index) const {
  if (!has_stream_copy(index)) return host_params_.data() + host_at(index);
  if (weights_land_in_compute_copy_)
    return reinterpret_cast<const uint16_t*>(stream_host_.data()) + stream_host_at_[index];
  return stream_host_.data() + stream_host_at_[index];
}

void HostUpdatedModel::write_stream_copy(size_t index, const float* weights) {
  if (!has_stream_copy(index)) return;
  const long count = static_cast<long>(layout_.spans()[index].count);
  if (!weights_land_in_compute_copy_)
    return copy_in_parallel(stream_host_.data() + stream_host_at_[index], weights,
                            static_cast<size_t>(count));
  uint16_t* out = reinterpret_cast<uint16_t*>(stream_host_.data()) + stream_host_at_[index];
#pragma omp parallel for schedule(static)
  for (long i = 0; i < count; ++i) out[i] = bf16_from_float(weights[i]);
}

void HostUpdatedModel::send_weights_now(size_t index, const float* weights) {
  const size_t count = layout_.spans()[index].count;
  if (streams(index)) return write_stream_copy(index, weights);  // the next fill reads it
  if (device_copy_spans_.holds(index))
    device_->copy_to_device(params_.data() + device_copy_spans_.at[index], weights, count);
  if (!weights_land_in_compute_copy_) return;
  std::promise<void> landed;
  device_->copy_to_compute_copy_async(backend_->compute_copy(index), weights, count,
                                      landing_staging_.data(), landing_staging_.count(),
                                      [&landed] { landed.set_value(); });
  landed.get_future().wait();
}

HostUpdatedModel::WorkerShares::WorkerShares(const HostUpdatedModel& model, const Span& span)
    : starts_us(model.worker_tracks_.size(), 0.0), name(trace_name(TaskKind::kAdamW, span.kind)) {
  TraceRecorder* const trace =
      model.trace_ != nullptr && model.trace_->recording() ? model.trace_ : nullptr;
  if (span.kind == SpanKind::kBlock) {
    // Appended piece by piece: `" " + std::to_string(...)` trips GCC 12's -Wrestrict.
    name += ' ';
    name += std::to_string(span.layer);
  }
  if (trace == nullptr || model.worker_tracks_.empty()) return;
  hook = [this, trace, tracks = &model.worker_tracks_](int worker, bool started) {
    if (started) {
      starts_us[worker] = trace->now_us();
      return;
    }
    try {
      trace->add_span((*tracks)[worker], name, starts_us[worker], trace->now_us());
    } catch (...) {  // a lost trace span is not worth failing the update for
    }
  };
}

void HostUpdatedModel::update_span_part(size_t index, const float* grads, const AdamWStep& adamw,
                                        int trace_track) {
  LAYUP_CHECK(shards_, "internal error: a part's update without optimizer shards");
  const Span& span = layout_.spans()[index];
  // Where the state is: the host's (the whole master weights, this rank's part of the moments),
  // or a disk span's staging slot, which holds the same.
  std::optional<DiskTier::Lease> lease;
  float* master = nullptr;
  AdamWMoments moments;
  if (disk_tier_ && disk_tier_->holds(index)) {
    TraceSpan traced(trace_, trace_track, "read from disk", span.layer);
    lease = disk_tier_->take(index);
    master = lease->params;
    moments = lease->moments;
  } else {
    master = host_params_.data() + host_at(index);
    moments = host_moments_.in(host_moments_buffer_.data(), index);
  }
  const OptimizerShards::Part part = shards_->part(span, ranks_->rank());
  if (part.count > 0) {
    TraceSpan traced(trace_, trace_track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
    WorkerShares shares(*this, span);
    // The part's moments are coded from its first element.
    host_adamw_->update_span_part(
        layout_, span, part.first, part.count,
        AdamWStateBuffers::in_place(master + part.first, grads + part.first, moments), adamw,
        shares.hook);
  }
  {
    TraceSpan traced(trace_, trace_track, "all_gather_weights", span.layer);
    ranks_->all_gather(master, shards_->bounds_within(span.offset, span.offset + span.count));
  }
  if (!lease) return send_weights_now(index, master);
  // The write-back and the copy to the device only read the slot: they run side by side, and the
  // slot is free once both are done.
  const std::function<void()> slot_free = disk_tier_->put_back(*lease);
  try {
    send_weights_now(index, master);
  } catch (...) {
    slot_free();  // no copy reads the slot: the write-back may finish
    throw;
  }
  slot_free();
}

void HostUpdatedModel::update_staged_span(size_t index, const float* grads,
                                          const OptimizerState& from, const OptimizerState& to,
                                          const AdamWStep& adamw, int trace_track,
                                          std::function<void()> landed) {
  const Span& span = layout_.spans()[index];
  const size_t at = host_at(index);
  // The device updates the fp32 copy it computes with where it has one (its weights land there
  // with no copy of their own); else the master weights in the slot, writing the bf16 compute
  // copy where the weights land in it, or nothing where it computes with the master weights in
  // place. A streamed block's new weights go to the host's copy the ring fills from.
  const bool device_copy = device_copy_spans_.holds(index);
  const bool streamed = streams(index);
  StagedTier::Update update;
  update.index = index;
  update.grads = grads;
  update.from_params = from.params + at;
  update.from_moments = host_moments_.base(from.moments, index);
  update.to_params = to.params + at;
  update.to_moments = host_moments_.base(to.moments, index);
  update.device_params = device_copy ? params_.data() + device_copy_spans_.at[index] : nullptr;
  update.bf16_weights = weights_land_in_compute_copy_ && !device_copy && !streamed
                            ? backend_->compute_copy(index)
                            : nullptr;
  // (Without a bf16 copy of its own, a streamed block's fills read the master weights.)
  if (streamed && has_stream_copy(index)) {
    update.stream_copy = reinterpret_cast<uint16_t*>(stream_host_.data()) + stream_host_at_[index];
    update.stream_element_bytes = sizeof(uint16_t);
  }
  TraceSpan traced(trace_, trace_track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
  staged_tier_->update(update, adamw, std::move(landed));
}

void HostUpdatedModel::update_span(size_t index, const float* grads, const OptimizerState& from,
                                   const OptimizerState& to, const AdamWStep& adamw,
                                   int trace_track, std::function<void()> landed) {
  const Span& span = layout_.spans()[index];
  if (staged(index)) return update_staged_span(index, grads, from, to, adamw, trace_track, landed);
  // Where the state is read and written: the host's packed state, or a disk span's staging slot,
  // which goes back to disk once updated and is free again when its weights have landed too.
  std::optional<DiskTier::Lease> lease;
  AdamWStateBuffers buffers{};
  if (disk_tier_ && disk_tier_->holds(index)) {
    TraceSpan traced(trace_, trace_track, "read from disk", span.layer);
    lease = disk_tier_->take(index);
    buffers = AdamWStateBuffers::in_place(lease->params, grads, lease->moments);
  } else {
    const size_t at = host_at(index);
    buffers = {from.params + at, grads, host_moments_.in(from.moments, index), to.params + at,
               host_moments_.in(to.moments, index)};
  }
  const float* master = buffers.params_out;
  TraceRecorder* const trace = trace_ != nullptr && trace_->recording() ? trace_ : nullptr;
  {
    TraceSpan traced(trace_, trace_track, trace_name(TaskKind::kAdamW, span.kind), span.layer);
    WorkerShares shares(*this, span);
    host_adamw_->update_span(layout_, span, buffers, adamw, shares.hook);
  }
  std::function<void()> slot_free;
  if (lease) {
    // The write-back and the copy to the device only read the slot: they run side by side.
    slot_free = disk_tier_->put_back(*lease);
    landed = [slot_free, landed = std::move(landed)] {
      slot_free();
      landed();
    };
  }
  // A streamed span's new weights stay on the host, in its bf16 copy where it has one.
  write_stream_copy(index, master);
  const bool to_compute_copy =
      weights_land_in_compute_copy_ && !device_copy_spans_.holds(index) && !streams(index);
  if (!to_compute_copy && !device_copy_spans_.holds(index)) {
    landed();  // the device reads the master weights in place: nothing to send
    return;
  }
  // The transfer is traced from its start to its landing on the "to device" track.
  const double start_us = trace != nullptr ? trace->now_us() : 0.0;
  auto traced_landed = [trace, track = to_device_track_, start_us, kind = span.kind,
                        layer = span.layer, landed] {
    if (trace != nullptr) {
      std::string name = trace_name(TaskKind::kWeightsToDevice, kind);
      if (kind == SpanKind::kBlock) {
        name += ' ';
        name += std::to_string(layer);
      }
      trace->add_span(track, name, start_us, trace->now_us());
    }
    landed();
  };
  try {
    if (to_compute_copy)
      device_->copy_to_compute_copy_async(backend_->compute_copy(index), master, span.count,
                                          landing_staging_.data(), landing_staging_.count(),
                                          std::move(traced_landed));
    else
      device_->copy_to_device_async(params_.data() + device_copy_at(index), master, span.count,
                                    std::move(traced_landed));
  } catch (...) {
    if (slot_free) slot_free();  // no copy reads the slot: the write-back may finish
    throw;
  }
}

}  // namespace layup
