// DiskTier: the disk spans' state in a DiskStateStore and its ring of staging slots.
#include "schedule/disk_tier.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"
#include "memory/tensor_class.h"

namespace layup {

namespace {

// How many of the expected spans the ring reads ahead of (at most one slot each).
size_t read_ahead(size_t slots) {
  return slots;
}

std::string span_name(const Span& span) {
  if (span.kind == SpanKind::kBlock) return "block " + std::to_string(span.layer);
  return span.kind == SpanKind::kEmbeddings ? "embeddings" : "final norm";
}

}  // namespace

std::vector<DiskRecord> DiskTier::records(const ParameterLayout& layout,
                                          const std::vector<UpdateSite>& sites,
                                          OptimizerStateKind kind, const OptimizerShards* shards,
                                          int rank) {
  std::vector<DiskRecord> records;
  for (size_t index = 0; index < sites.size(); ++index) {
    if (sites[index] != UpdateSite::kDisk) continue;
    const Span& span = layout.spans()[index];
    records.push_back(
        {span.count, span_name(span), kind,
         shards != nullptr ? std::optional(shards->part(span, rank).count) : std::nullopt});
  }
  return records;
}

BufferList DiskTier::staging_buffers(const std::vector<DiskRecord>& records, size_t slots,
                                     MemoryKind kind) {
  DiskStagingRing ring = disk_staging_ring(records, slots);
  // Room to align each slot inside its buffer: the CPU backend's allocations are only 64-byte
  // aligned, and direct I/O needs kDiskAlignment.
  ring.slot_bytes += kDiskAlignment;
  return disk_staging_buffers(ring, kind);
}

BufferList DiskTier::buffers(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                             size_t slots, DeviceKinds kinds, OptimizerStateKind kind,
                             const OptimizerShards* shards, int rank) {
  const std::vector<DiskRecord> disk = records(layout, sites, kind, shards, rank);
  if (disk.empty()) return {};
  BufferList list = staging_buffers(disk, slots, kinds.host_copy);
  append(list, DiskStateStore::buffers());
  return list;
}

DiskUsage DiskTier::disk_usage(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                               const std::string& dir, OptimizerStateKind kind,
                               const OptimizerShards* shards, int rank) {
  return DiskStateStore::disk_usage(dir, records(layout, sites, kind, shards, rank));
}

DiskTier::DiskTier(Device& device, const ParameterLayout& layout,
                   const std::vector<UpdateSite>& sites, const std::string& dir, size_t slots,
                   OptimizerStateKind kind, const OptimizerShards* shards, int rank)
    : device_(device),
      layout_(layout),
      kind_(kind),
      record_of_(layout.spans().size(), kNotHere),
      moment_first_(layout.spans().size(), 0),
      parts_(shards != nullptr) {
  LAYUP_CHECK(sites.size() == layout.spans().size(), "the update sites name ", sites.size(),
              " spans, but the model has ", layout.spans().size());
  for (size_t index = 0; index < sites.size(); ++index) {
    if (sites[index] != UpdateSite::kDisk) continue;
    LAYUP_CHECK(layout.spans()[index].kind == SpanKind::kBlock,
                "only blocks can keep their optimizer state on disk, not the ",
                span_name(layout.spans()[index]));
    record_of_[index] = spans_.size();
    spans_.push_back(index);
    if (shards != nullptr) moment_first_[index] = shards->part(layout.spans()[index], rank).first;
  }
  if (spans_.empty()) return;
  LAYUP_CHECK(!dir.empty(),
              "blocks placed on disk need a directory for their file: give --offload-dir");
  LAYUP_CHECK(slots >= 1, "the disk tier needs at least one staging slot");
  const std::vector<DiskRecord> disk = records(layout, sites, kind, shards, rank);
  // Ranks on one machine may share the directory: each file is named for its rank.
  DiskStateStoreOptions store_options;
  if (shards != nullptr) store_options.file_tag = "rank" + std::to_string(rank);
  store_ = std::make_unique<DiskStateStore>(dir, disk, store_options);
  for (const PlannedAllocation& buffer : staging_buffers(disk, slots, device.host_memory_kind())) {
    Slot slot;
    slot.buffer = device.allocate(buffer);
    const auto address = reinterpret_cast<uintptr_t>(slot.buffer.data());
    slot.data =
        reinterpret_cast<float*>((address + kDiskAlignment - 1) / kDiskAlignment * kDiskAlignment);
    slots_.push_back(std::move(slot));
  }
  ring_ = std::thread([this] { run_ring(); });
}

DiskTier::~DiskTier() {
  if (!ring_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  ring_.join();
  if (failure_) {
    try {
      std::rethrow_exception(failure_);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "layup: the disk tier's last write-back failed: %s\n", error.what());
    }
  }
}

std::string DiskTier::describe() const {
  if (spans_.empty()) return "";
  size_t largest = 0;
  for (size_t record = 0; record < store_->record_count(); ++record)
    largest = std::max(largest, store_->layout(record).bytes);
  return std::to_string(spans_.size()) + " block(s) on disk" +
         (parts_ ? " (their whole master weights, this rank's part of their moments)" : "") + ", " +
         std::to_string(slots_.size()) + " staging slot(s) of " + format_bytes(largest) + "; " +
         store_->describe();
}

void DiskTier::expect(const std::vector<size_t>& spans) {
  if (spans_.empty()) return;
  {
    std::lock_guard lock(mutex_);
    for (const size_t span : spans) {
      LAYUP_CHECK(holds(span), "span ", span, " is not on disk");
      expected_.push_back(span);
    }
  }
  changed_.notify_all();
}

void DiskTier::expect_step(const std::vector<size_t>& spans) {
  expect(spans);
  std::lock_guard lock(mutex_);
  predicted_ = spans;
}

AdamWMoments DiskTier::moments_in(size_t span, float* record) const {
  const DiskRecordLayout& layout = record_layout(span);
  if (kind_ == OptimizerStateKind::kFp32)
    return AdamWMoments::fp32(record + layout.m_offset(), record + layout.v_offset());
  return AdamWMoments::in_buffer(kind_, record + layout.m_offset(), layout.moment_count);
}

DiskTier::Lease DiskTier::lease_of(size_t slot) {
  const size_t span = slots_[slot].span;
  float* data = slots_[slot].data;
  return {span, slot, data + record_layout(span).params_offset(), moments_in(span, data)};
}

size_t DiskTier::slot_holding(size_t span) const {
  for (size_t slot = 0; slot < slots_.size(); ++slot)
    if (slots_[slot].state != SlotState::kFree && slots_[slot].span == span) return slot;
  return kNotHere;
}

std::vector<size_t> DiskTier::read_ahead_window() const {
  const size_t ahead = read_ahead(slots_.size());
  std::vector<size_t> window;
  for (const size_t span : expected_) {
    if (window.size() == ahead) return window;
    window.push_back(span);
  }
  for (const size_t span : predicted_) {
    if (window.size() == ahead) return window;
    window.push_back(span);
  }
  return window;
}

bool DiskTier::expected_soon(size_t span) const {
  const std::vector<size_t> window = read_ahead_window();
  return std::find(window.begin(), window.end(), span) != window.end();
}

size_t DiskTier::prefetch_victim() const {
  for (size_t slot = 0; slot < slots_.size(); ++slot)
    if (slots_[slot].state == SlotState::kFree) return slot;
  for (size_t slot = 0; slot < slots_.size(); ++slot)
    if (slots_[slot].state == SlotState::kReady && !expected_soon(slots_[slot].span)) return slot;
  return kNotHere;
}

size_t DiskTier::take_victim(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    const size_t victim = prefetch_victim();
    if (victim != kNotHere) return victim;
    // Every slot is read ahead for later spans, busy, or being written: a ready one is given up
    // (it is read again when its turn comes), else a read ahead is, else wait for a write-back.
    for (size_t slot = 0; slot < slots_.size(); ++slot)
      if (slots_[slot].state == SlotState::kReady) {
        ++traffic_.given_up;
        return slot;
      }
    for (size_t slot = 0; slot < slots_.size(); ++slot) {
      if (slots_[slot].state != SlotState::kReading) continue;
      ++traffic_.given_up;
      DiskTicket abandoned = std::move(slots_[slot].ticket);
      slots_[slot].state = SlotState::kInUse;  // nobody else touches it meanwhile
      lock.unlock();
      try {
        abandoned.wait();
      } catch (...) {  // the span is read again when it is taken
      }
      lock.lock();
      return slot;
    }
    rethrow_failure();
    changed_.wait(lock);
  }
}

DiskTier::Lease DiskTier::take(size_t span) {
  LAYUP_CHECK(holds(span), "span ", span, " is not on disk");
  std::unique_lock lock(mutex_);
  rethrow_failure();
  // The entries before the span's first are updates that will not come. The span itself stays
  // first until it is in a slot: where it is not read yet, the ring reads it next, into the first
  // slot a write-back frees (a read of a later span there would be given up for it).
  const auto first = std::find(expected_.begin(), expected_.end(), span);
  const bool expected = first != expected_.end();
  if (expected) expected_.erase(expected_.begin(), first);
  changed_.notify_all();
  const auto consume = [&] {
    if (expected) expected_.pop_front();
    changed_.notify_all();  // the ring may read further ahead now
  };
  for (;;) {
    const size_t slot = slot_holding(span);
    if (slot == kNotHere && !expected) break;
    if (slot == kNotHere) {  // the ring reads it as soon as a slot is free
      changed_.wait(lock);
      rethrow_failure();
      continue;
    }
    Slot& held = slots_[slot];
    LAYUP_CHECK(held.state != SlotState::kInUse, "span ", span,
                " of the disk tier is already being updated");
    if (held.state == SlotState::kReady) {
      held.state = SlotState::kInUse;
      consume();
      return lease_of(slot);
    }
    if (held.state == SlotState::kReading) {
      DiskTicket read = std::move(held.ticket);
      held.state = SlotState::kInUse;
      consume();
      lock.unlock();
      return finish_take(slot, [&] { read.wait(); });
    }
    changed_.wait(lock);  // kWriting: its last update is still being written back
    rethrow_failure();
  }
  // Not expected: read it now, into a slot taken from the read-ahead if need be.
  const size_t slot = take_victim(lock);
  slots_[slot].state = SlotState::kInUse;
  slots_[slot].span = span;
  ++traffic_.read_on_take;
  traffic_.bytes_read += record_layout(span).bytes;
  lock.unlock();
  return finish_take(slot, [&] { store_->read_now(record_of_[span], slots_[slot].data); });
}

DiskTier::Lease DiskTier::finish_take(size_t slot, const std::function<void()>& read) {
  try {
    read();
  } catch (...) {
    std::lock_guard relock(mutex_);
    slots_[slot].state = SlotState::kFree;
    changed_.notify_all();
    throw;
  }
  return lease_of(slot);
}

std::function<void()> DiskTier::put_back(const Lease& lease) {
  {
    std::lock_guard lock(mutex_);
    Slot& slot = slots_[lease.slot];
    LAYUP_CHECK(slot.state == SlotState::kInUse && slot.span == lease.span,
                "a disk tier slot was put back that was not taken");
    slot.ticket = store_->write(record_of_[lease.span], slot.data);
    slot.state = SlotState::kWriting;
    ++traffic_.written_back;
    traffic_.bytes_written += record_layout(lease.span).bytes;
    slot.landed = false;
    writing_.push_back(lease.slot);
  }
  changed_.notify_all();
  return [this, slot = lease.slot] {
    {
      std::lock_guard lock(mutex_);
      slots_[slot].landed = true;
    }
    changed_.notify_all();
  };
}

bool DiskTier::settle_stale_reads() {
  bool in_flight = false;
  for (Slot& slot : slots_) {
    if (slot.state != SlotState::kReading || expected_soon(slot.span)) continue;
    if (!slot.ticket.done()) {
      in_flight = true;
      continue;
    }
    try {
      slot.ticket.wait();  // done: returns at once, or throws the read's error
      slot.state = SlotState::kReady;
    } catch (...) {  // nobody waits for this read: the span is read again when it is taken
      slot.state = SlotState::kFree;
      slot.span = kNotHere;
    }
  }
  return in_flight;
}

void DiskTier::run_ring() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // A read ahead that the expected order no longer wants (the next step came in another order
    // than the last) keeps its slot until it is done; then the slot holds a span like any other.
    const bool stale_reads = settle_stale_reads();
    // Reads first: they are what the next update waits for, and starting one never blocks.
    bool started = false;
    for (const size_t span : read_ahead_window()) {
      if (slot_holding(span) != kNotHere) continue;
      const size_t slot = prefetch_victim();
      if (slot == kNotHere) break;
      try {
        slots_[slot].ticket = store_->read(record_of_[span], slots_[slot].data);
      } catch (...) {  // e.g. its write-back still holds the record: read it when it is taken
        break;
      }
      slots_[slot].state = SlotState::kReading;
      slots_[slot].span = span;
      ++traffic_.read_ahead;
      traffic_.bytes_read += record_layout(span).bytes;
      started = true;
      break;
    }
    if (started) {
      changed_.notify_all();  // a take may be waiting for this read to start
      continue;
    }
    if (!writing_.empty()) {
      const size_t slot = writing_.front();
      DiskTicket write = std::move(slots_[slot].ticket);
      lock.unlock();
      std::exception_ptr failed;
      try {
        write.wait();
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      changed_.wait(lock, [&] { return slots_[slot].landed; });
      writing_.pop_front();
      // A failed write leaves the record on disk stale: the slot keeps nothing, and the failure
      // stops the run at the next take.
      slots_[slot].state = failed ? SlotState::kFree : SlotState::kReady;
      if (failed && !failure_) failure_ = failed;
      changed_.notify_all();
      continue;
    }
    if (stopping_) return;
    // A stale read's end wakes nobody: look again shortly.
    if (stale_reads)
      changed_.wait_for(lock, std::chrono::milliseconds(1));
    else
      changed_.wait(lock);
  }
}

void DiskTier::rethrow_failure() {
  if (failure_) std::rethrow_exception(failure_);
}

void DiskTier::wait_for_write_backs(std::unique_lock<std::mutex>& lock) {
  changed_.wait(lock, [&] { return writing_.empty(); });
  rethrow_failure();
}

size_t DiskTier::settled_slot(size_t span, std::unique_lock<std::mutex>& lock) {
  wait_for_write_backs(lock);
  const size_t slot = slot_holding(span);
  if (slot != kNotHere && slots_[slot].state == SlotState::kReading) {
    slots_[slot].ticket.wait();
    slots_[slot].state = SlotState::kReady;
  }
  return slot;
}

void DiskTier::read_span(size_t span, const SpanState& out) {
  LAYUP_CHECK(holds(span), "span ", span, " is not on disk");
  LAYUP_CHECK(!parts_ || (out.m == nullptr && out.v == nullptr && out.coded == nullptr),
              "internal error: this disk tier keeps a part of each span's moments: read_moments "
              "reads them");
  std::unique_lock lock(mutex_);
  const size_t slot = settled_slot(span, lock);
  const size_t count = layout_.spans()[span].count;
  // Where `out` wants the moments coded, as the run keeps them.
  const std::optional<AdamWMoments> coded_out =
      out.coded != nullptr ? std::optional(AdamWMoments::in_buffer(kind_, out.coded, count))
                           : std::nullopt;
  if (slot != kNotHere) {
    const Lease lease = lease_of(slot);
    if (out.params) std::copy_n(lease.params, count, out.params);
    if (coded_out)
      copy_moments(lease.moments, *coded_out, count);
    else if (out.m != nullptr || out.v != nullptr)
      decode_moments(lease.moments, count, out.m, out.v);
    return;
  }
  // Under the lock: the ring starts no read of it meanwhile.
  const DiskRecordLayout& layout = record_layout(span);
  const size_t params_bytes = out.params != nullptr ? layout.part_floats * sizeof(float) : 0;
  if (kind_ == OptimizerStateKind::kFp32) {
    float* m = coded_out ? coded_out->m_fp32() : out.m;
    float* v = coded_out ? coded_out->v_fp32() : out.v;
    store_->read_parts(record_of_[span], out.params, m, v);
    traffic_.bytes_read += params_bytes + ((m != nullptr) + (v != nullptr)) *
                                              layout.moment_part_floats * sizeof(float);
    return;
  }
  const bool decoded = out.m != nullptr || out.v != nullptr;
  std::vector<float> coded(!coded_out && decoded ? layout.moment_bytes / sizeof(float) : 0);
  void* moments = coded_out ? out.coded : decoded ? coded.data() : nullptr;
  store_->read_parts(record_of_[span], out.params, moments);
  if (!coded_out && decoded)
    decode_moments(AdamWMoments::in_buffer(kind_, coded.data(), count), count, out.m, out.v);
  traffic_.bytes_read += params_bytes + (moments != nullptr ? layout.moment_bytes : 0);
}

void DiskTier::read_moments(size_t span, float* packed) {
  LAYUP_CHECK(holds(span), "span ", span, " is not on disk");
  std::unique_lock lock(mutex_);
  const size_t slot = settled_slot(span, lock);
  const DiskRecordLayout& layout = record_layout(span);
  const AdamWMoments out = AdamWMoments::in_buffer(kind_, packed, layout.moment_count);
  if (slot != kNotHere) return copy_moments(lease_of(slot).moments, out, layout.moment_count);
  if (kind_ == OptimizerStateKind::kFp32) {
    store_->read_parts(record_of_[span], nullptr, out.m_fp32(), out.v_fp32());
    traffic_.bytes_read += 2 * layout.moment_part_floats * sizeof(float);
  } else {
    store_->read_parts(record_of_[span], nullptr, packed);
    traffic_.bytes_read += layout.moment_bytes;
  }
}

void DiskTier::write_span(size_t span, const ConstSpanState& in) {
  LAYUP_CHECK(holds(span), "span ", span, " is not on disk");
  std::unique_lock lock(mutex_);
  wait_for_write_backs(lock);
  const size_t slot = slot_holding(span);
  if (slot != kNotHere) {  // what the slot holds is old now
    if (slots_[slot].state == SlotState::kReading) slots_[slot].ticket.wait();
    LAYUP_CHECK(slots_[slot].state != SlotState::kInUse, "span ", span,
                " of the disk tier is being updated while it is imported");
    slots_[slot].state = SlotState::kFree;
    slots_[slot].span = kNotHere;
  }
  const DiskRecordLayout& layout = record_layout(span);
  const size_t record = record_of_[span];
  // The record's moments from `in`, the whole span's: those of its floats from `first` on.
  const size_t first = moment_first_[span];
  const size_t count = layout.moment_count;
  const bool whole = count == layout.count;
  if (in.coded != nullptr) {
    const AdamWMoments source =
        AdamWMoments::in_buffer(kind_, const_cast<void*>(in.coded), layout.count).at(first);
    if (kind_ == OptimizerStateKind::kFp32) {
      store_->write_parts(record, in.params, source.m_fp32(), source.v_fp32());
    } else if (whole) {
      store_->write_parts(record, in.params, in.coded);
    } else {
      std::vector<float> part(layout.moment_bytes / sizeof(float));
      copy_moments(source, AdamWMoments::in_buffer(kind_, part.data(), count), count);
      store_->write_parts(record, in.params, part.data());
    }
  } else if (kind_ == OptimizerStateKind::kFp32) {
    store_->write_parts(record, in.params, in.m != nullptr ? in.m + first : nullptr,
                        in.v != nullptr ? in.v + first : nullptr);
  } else if (in.m == nullptr || in.v == nullptr) {
    store_->write_parts(record, in.params, nullptr);
  } else {
    // Coded from the part's first element (the span's where it is whole), as its updates code it.
    std::vector<float> coded(layout.moment_bytes / sizeof(float));
    encode_moments(in.m + first, in.v + first, count,
                   AdamWMoments::in_buffer(kind_, coded.data(), count));
    store_->write_parts(record, in.params, coded.data());
  }
  traffic_.bytes_written += layout.bytes;  // null m, v: zeros written
}

DiskTraffic DiskTier::traffic() {
  std::lock_guard lock(mutex_);
  return traffic_;
}

}  // namespace layup
