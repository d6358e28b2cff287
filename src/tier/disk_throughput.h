// How fast the disk tier's store (disk_state_store.h) writes and reads span-sized records in a
// directory: what `layup bench-disk` prints and `layup calibrate` keeps for the step-time model.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tier/disk_state_store.h"

namespace layup {

struct DiskThroughput {
  double write_bytes_per_s = 0.0, read_bytes_per_s = 0.0;
  // Reads and writes at once, as a step of the disk tier issues them (the next spans read ahead
  // while the last are written back): the bytes of both over the time they took together.
  double mixed_bytes_per_s = 0.0;
  std::string io_mode;  // DiskStateStore::io_mode(): direct, or buffered where direct was refused
};

// `count` records of `record_floats` floats each in `dir`, with two staging slots of pattern data
// (touched before any timing) that every measurement reuses.
class DiskThroughputBench {
 public:
  DiskThroughputBench(std::string dir, size_t record_floats, size_t count);
  ~DiskThroughputBench();

  // Writes every record from the two slots in turn (two queued: the I/O threads never wait for
  // the caller), then reads them all back the same way; checks the last two
  // that were read. Then, with four records or more (else mixed_bytes_per_s stays 0), writes
  // every record again while reading the one half the file ahead, two writes and two reads
  // queued (the same bytes go back, so the reads still see them). Buffered writes are timed until
  // the disk has them, and the file's pages are dropped before the reads, so the reads come from
  // the disk.
  DiskThroughput measure(const DiskStateStoreOptions& options);

  size_t record_bytes() const { return record_bytes_; }
  size_t total_bytes() const { return record_bytes_ * records_.size(); }

 private:
  struct FreeDeleter {
    void operator()(std::byte* data) const;
  };
  using Slot = std::unique_ptr<std::byte[], FreeDeleter>;

  std::string dir_;
  std::vector<DiskRecord> records_;
  size_t record_bytes_ = 0;
  std::vector<Slot> slots_, read_slots_;
};

}  // namespace layup
