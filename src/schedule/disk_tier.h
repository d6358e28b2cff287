// DiskTier: the spans the layup schedule keeps on disk (UpdateSite::kDisk): their fp32 master
// weights and AdamW moments (in the run's optimizer state kind) in one DiskStateStore file under
// ScheduleOptions::offload_dir, and a ring of staging slots in host memory (pinned on CUDA) that an
// update reads a span into, updates in place, sends to the device from and writes back. See
// docs/schedules.md ("The disk tier"). With ZeRO-1 (docs/parallel.md) each rank has a tier and a
// file of its own, holding each span's whole master weights and this rank's part of its moments
// (OptimizerShards::part), coded from the part's first element as the host's parts are.
//
// Read-ahead: the schedule says in which order it will update the disk spans (expect), and
// expect_step adds that the next step will update them alike; the ring's thread reads the next
// ones (this step's, then the next's) into free slots before they are asked for, and completes
// the write-backs. A slot keeps its span after the write-back until the slot is needed again, so
// with as many slots as disk spans nothing is read twice. An update that finds its span not read
// yet waits for the ring to read it next, rather than giving up a read ahead for a later span; a
// read ahead that the order no longer wants ends and leaves its slot to the ring.
//
// Threads: take and put_back from one thread at a time (the schedule's coordinator); the function
// put_back returns from any thread (a copy's landing); expect, expect_step, read_span and
// write_span between or during steps from any thread. A failed read or write is thrown by the next
// take, read_span or write_span.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/device.h"
#include "model/parameter_layout.h"
#include "optim/adamw_moments.h"
#include "schedule/optimizer_shards.h"
#include "schedule/schedule.h"
#include "tier/disk_state_store.h"

namespace layup {

class DiskTier {
 public:
  // `sites`: one per span (the disk spans are those at UpdateSite::kDisk), in `dir`, with `slots`
  // staging slots, the moments in `kind`; with `shards` (ZeRO-1), rank `rank`'s part of each
  // span's moments, else the whole span's. `device` and `shards` must outlive this.
  DiskTier(Device& device, const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
           const std::string& dir, size_t slots,
           OptimizerStateKind kind = OptimizerStateKind::kFp32,
           const OptimizerShards* shards = nullptr, int rank = 0);
  // Finishes the write-backs (an error is printed: nobody is left to throw it to).
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // The disk spans of `sites` as the store's records, in layout order (with `shards`, rank
  // `rank`'s: each holds its part of the span's moments).
  static std::vector<DiskRecord> records(const ParameterLayout& layout,
                                         const std::vector<UpdateSite>& sites,
                                         OptimizerStateKind kind = OptimizerStateKind::kFp32,
                                         const OptimizerShards* shards = nullptr, int rank = 0);
  // What it allocates on the host (the slots, each padded to align it for direct I/O, and the
  // store's bounce buffer), and on disk.
  static BufferList buffers(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                            size_t slots, DeviceKinds kinds,
                            OptimizerStateKind kind = OptimizerStateKind::kFp32,
                            const OptimizerShards* shards = nullptr, int rank = 0);
  static DiskUsage disk_usage(const ParameterLayout& layout, const std::vector<UpdateSite>& sites,
                              const std::string& dir,
                              OptimizerStateKind kind = OptimizerStateKind::kFp32,
                              const OptimizerShards* shards = nullptr, int rank = 0);

  bool holds(size_t span) const { return record_of_[span] != kNotHere; }
  const std::vector<size_t>& spans() const { return spans_; }
  // One line: the spans, the file and its I/O mode, the slots.
  std::string describe() const;

  // The order of the updates to come (disk spans), appended to what is still expected: the ring
  // reads ahead in that order. A take consumes the entries up to its span's first, so an update
  // that never comes (a step abandoned) costs only a read.
  void expect(const std::vector<size_t>& spans);
  // A step's order of updates, expected as `expect` does, and the next step's order assumed
  // alike: once this step's expected updates are fewer than the slots, the ring reads ahead into
  // the next step's first spans, while the rest of this step's backward runs, rather than at the
  // next step's start (where the disk would idle between the steps). A next step in another order
  // costs a few reads; one that never comes, up to a read a slot.
  void expect_step(const std::vector<size_t>& spans);

  // One span's state in a staging slot, for one update.
  struct Lease {
    size_t span = 0;
    size_t slot = 0;
    float* params = nullptr;  // the whole span's
    // In the slot, in the run's kind: the whole span's, or (ZeRO-1) this rank's part's, coded
    // from the part's first element.
    AdamWMoments moments;
  };
  // The span's state, read ahead or read now; the slot is the caller's until put_back.
  Lease take(size_t span);
  // Starts writing the slot back; returns what to call once nothing else reads the slot (the new
  // weights' copy to the device has landed); until then, and until the write is done, the slot
  // stays busy. The returned function neither blocks for long nor throws.
  std::function<void()> put_back(const Lease& lease);

  // A span's state out of (or into) the tier, whole: for export and import. Waits for the
  // write-backs first. With ZeRO-1, write_span keeps this rank's part of the moments `in` holds
  // for the whole span, and read_span reads the weights only (read_moments reads the part).
  void read_span(size_t span, const SpanState& out);
  void write_span(size_t span, const ConstSpanState& in);
  // The moments the tier keeps of `span` (ZeRO-1: this rank's part) into `packed`, coded from
  // their first element as PackedMoments packs them (PackedMoments::padded_bytes of moment_count
  // floats). Waits for the write-backs first.
  void read_moments(size_t span, float* packed);
  // The floats whose moments the tier keeps of `span`, and the first of them in the span.
  size_t moment_count(size_t span) const { return record_layout(span).moment_count; }
  size_t moment_first(size_t span) const { return moment_first_[span]; }

  // What it has moved so far.
  DiskTraffic traffic();

 private:
  static constexpr size_t kNotHere = static_cast<size_t>(-1);

  enum class SlotState { kFree, kReading, kReady, kInUse, kWriting };
  struct Slot {
    DeviceBuffer buffer;
    float* data = nullptr;  // aligned to kDiskAlignment inside buffer
    SlotState state = SlotState::kFree;
    size_t span = kNotHere;
    DiskTicket ticket;  // the read (kReading) or the write (kWriting)
    bool landed = true;
  };

  // The staging slots' buffers: `slots` of the largest record, each padded to align it inside.
  static BufferList staging_buffers(const std::vector<DiskRecord>& records, size_t slots,
                                    MemoryKind kind);
  Lease lease_of(size_t slot);
  // Where a span's moments lie in `record`, a buffer holding its record.
  AdamWMoments moments_in(size_t span, float* record) const;
  // Under mutex_ (dropped while waiting): returns once every write-back is done; throws the first
  // failed transfer.
  void wait_for_write_backs(std::unique_lock<std::mutex>& lock);
  // Under mutex_: once the write-backs and a read of `span` in flight are done, the slot that
  // holds it (ready), or kNotHere.
  size_t settled_slot(size_t span, std::unique_lock<std::mutex>& lock);
  // take's end, the lock not held: runs `read` (which fills the slot, taken for the span), and on
  // its failure frees the slot and rethrows.
  Lease finish_take(size_t slot, const std::function<void()>& read);
  // Under mutex_: the slot holding `span` (any state), or kNotHere.
  size_t slot_holding(size_t span) const;
  // Under mutex_: a slot to read `span` into ahead of its take, or kNotHere: a free one, or one
  // whose span is not among the next few expected.
  size_t prefetch_victim() const;
  // Under mutex_: the spans the ring reads ahead, in order: the first of the expected updates,
  // then of the next step's predicted ones, as many as the slots.
  std::vector<size_t> read_ahead_window() const;
  bool expected_soon(size_t span) const;
  const DiskRecordLayout& record_layout(size_t span) const {
    return store_->layout(record_of_[span]);
  }
  // Under mutex_ (the lock is dropped while it waits): a slot to read into now for a take.
  size_t take_victim(std::unique_lock<std::mutex>& lock);
  // Under mutex_: the reads ahead of spans no longer expected soon that have ended become ready
  // (or free, where they failed); returns whether any such read is still in flight.
  bool settle_stale_reads();
  void run_ring();
  void rethrow_failure();

  Device& device_;
  const ParameterLayout& layout_;
  const OptimizerStateKind kind_;
  std::vector<size_t> spans_;
  std::vector<size_t> record_of_;  // per span: its record in the store, or kNotHere
  // Per span: the first element whose moments its record holds (ZeRO-1: its part's; else 0).
  std::vector<size_t> moment_first_;
  const bool parts_;  // ZeRO-1: the records hold parts of the spans' moments
  std::unique_ptr<DiskStateStore> store_;
  std::vector<Slot> slots_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<size_t> expected_;    // spans, in the order of their updates to come
  std::vector<size_t> predicted_;  // the next step's order (expect_step), read ahead after them
  std::deque<size_t> writing_;     // slots, in the order their writes started
  DiskTraffic traffic_;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread ring_;  // last: joined before the slots and the store go
};

}  // namespace layup
