// DiskStateStore: the disk tier's storage, the optimizer state (fp32 master weights, AdamW m and
// v) of the spans placed on disk, in one file under --offload-dir, moved by a few I/O threads.
//
// Each span is one record: its params, m and v (fp32 moments), or its params and its moments in
// a compact optimizer state kind (bf16 or 8bit, laid out as AdamWMoments::in_buffer lays them out
// in one buffer), each part padded to 4096 bytes, one after the other in one 4096-aligned extent
// of the file. The moments may be those of a run of the span's floats only (ZeRO-1: a rank's
// part, DiskRecord::moment_count). One read or write of a span is one sequential
// transfer that direct I/O (O_DIRECT) can do without the page cache. A transfer is cut into
// chunks (4 MiB by default) that the I/O threads run in parallel, so one span's read keeps
// several requests in the disk's queue. The whole file is reserved (fallocate) at construction:
// a disk that cannot hold it fails there, not in the middle of a run. docs/memory.md has the
// file's life and its errors.
//
// Threading contract:
//  - read, write, read_parts, write_parts and the rest may be called from any thread.
//  - Transfers of different records run concurrently; at most one transfer of a record may be in
//    flight: a second one before the first's ticket is done is refused with layup::Error.
//  - The buffer of an asynchronous transfer must stay alive and untouched until its ticket is
//    done (wait returns, or the ticket is destroyed, which waits).
//  - Errors of a transfer (EIO, ENOSPC, a short transfer) are thrown by its ticket's wait.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/run_choices.h"
#include "memory/planned_allocation.h"

namespace layup {

// The alignment of the file's extents, of every staging buffer and of chunk sizes: direct I/O
// needs the device's logical block size, 512 or 4096 bytes on every disk we meet.
constexpr size_t kDiskAlignment = 4096;

// One span placed on disk.
struct DiskRecord {
  size_t count = 0;  // the span's floats; the record holds their params
  std::string name;  // for messages, e.g. "block 7" (default "record <index>")
  OptimizerStateKind kind = OptimizerStateKind::kFp32;  // how the moments are kept
  // The floats whose moments the record holds, a run of the span's coded from its first element
  // (ZeRO-1: this rank's part; it may be none); unset: all `count`.
  std::optional<size_t> moment_count = std::nullopt;

  size_t moments() const { return moment_count.value_or(count); }
};

// Where the parts sit in a record: in its extent of the file and, identically, in a staging
// buffer that reads or writes it whole. Each part starts 4096-aligned: the params (count floats);
// then fp32 moments as two parts, m and v (moment_count floats each), or compact ones as one
// part, laid out by AdamWMoments::in_buffer for moment_count floats.
struct DiskRecordLayout {
  size_t count = 0;         // the span's floats
  size_t moment_count = 0;  // the floats whose moments the record holds
  OptimizerStateKind kind = OptimizerStateKind::kFp32;
  size_t part_floats = 0;  // the params part, start to end: count rounded up to 4096 bytes
  // fp32: each moment's part, start to end (moment_count rounded up to 4096 bytes); compact: 0.
  size_t moment_part_floats = 0;
  size_t moment_bytes = 0;  // compact: the moments' bytes (a multiple of 4); fp32: 0
  size_t bytes = 0;         // the whole record

  size_t params_offset() const { return 0; }       // in floats
  size_t m_offset() const { return part_floats; }  // fp32: m; compact: the moments part
  size_t v_offset() const { return part_floats + moment_part_floats; }  // fp32 only
  // The parts in order: 3 (params, m, v) or 2 (params, moments); each one's offset in the record
  // and the bytes of data in it (the rest, up to the next part, is zero padding).
  size_t parts() const { return kind == OptimizerStateKind::kFp32 ? 3 : 2; }
  size_t part_offset(size_t part) const {
    return (part == 0 ? 0 : part_floats + (part - 1) * moment_part_floats) * sizeof(float);
  }
  size_t part_data_bytes(size_t part) const {
    if (part == 0) return count * sizeof(float);
    return kind == OptimizerStateKind::kFp32 ? moment_count * sizeof(float) : moment_bytes;
  }
};

// `moment_count` unset: the moments of every float.
DiskRecordLayout disk_record_layout(size_t count,
                                    OptimizerStateKind kind = OptimizerStateKind::kFp32,
                                    std::optional<size_t> moment_count = std::nullopt);
inline DiskRecordLayout disk_record_layout(const DiskRecord& record) {
  return disk_record_layout(record.count, record.kind, record.moment_count);
}

// The bytes of the file that holds `records`.
size_t disk_state_bytes(const std::vector<DiskRecord>& records);

// The disk space a store of `records` in `dir` takes: what the planner checks against
// read_disk_space(dir).usable_bytes().
struct DiskUsage {
  std::string dir;
  size_t bytes = 0;
};

// A ring of staging slots for reading and writing whole records: `slots` buffers of `slot_bytes`
// each (the largest record), each aligned to `alignment` (cudaHostAlloc's pages and
// std::aligned_alloc(kDiskAlignment, ...) both are).
struct DiskStagingRing {
  size_t slots = 0;
  size_t slot_bytes = 0;
  size_t alignment = kDiskAlignment;

  size_t bytes() const { return slots * slot_bytes; }
};

DiskStagingRing disk_staging_ring(const std::vector<DiskRecord>& records, size_t slots);

// The ring as the caller will allocate it, one host-side buffer per slot in `kind` memory (pinned
// where a GPU copies into it). A slot holds a span's master weights and moments while the CPU
// updates it; it is listed with the moments, two thirds of it.
BufferList disk_staging_buffers(const DiskStagingRing& ring, MemoryKind kind);

enum class DiskOp { kRead, kWrite };

struct DiskStateStoreOptions {
  int io_threads = 4;                    // I/O threads, each with one request in flight
  size_t chunk_bytes = size_t{4} << 20;  // the size of one request; a multiple of 4096
  bool direct_io = true;                 // false: buffered I/O even where O_DIRECT works
  // A word in the file's name (several ranks: "rank1"), which tells the files of processes that
  // share the directory apart in messages and in `lsof +L1`; the pid keeps the names apart anyway.
  std::string file_tag;
  // For tests: called on the I/O thread before each request with its record, direction and
  // offset in the file; a non-zero errno fails the request as if the system call had.
  std::function<int(size_t record, DiskOp op, size_t file_offset)> fault_for_tests;
};

struct DiskTransfer;  // one read or write of one record in flight; in the .cpp

// The handle of an asynchronous read or write. wait() blocks until every chunk is done and
// throws layup::Error if one failed; destroying a ticket waits too (the buffer must outlive the
// transfer) but cannot throw, so it prints an error nobody waited for to stderr.
class DiskTicket {
 public:
  DiskTicket() = default;
  DiskTicket(DiskTicket&& other) noexcept = default;
  DiskTicket& operator=(DiskTicket&& other) noexcept;
  ~DiskTicket();

  void wait();
  bool done() const;  // true once every chunk has finished (or for an empty ticket)
  bool valid() const { return transfer_ != nullptr; }

 private:
  friend class DiskStateStore;
  explicit DiskTicket(std::shared_ptr<DiskTransfer> transfer) : transfer_(std::move(transfer)) {}
  void wait_quietly() noexcept;

  std::shared_ptr<DiskTransfer> transfer_;
};

class DiskStateStore {
 public:
  // Creates the file in `dir`, unlinks it at once (a crashed or killed run leaves nothing behind;
  // the space is the kernel's to free when the descriptor closes), reserves its full size and
  // starts the I/O threads. Throws layup::Error naming the directory and what to do when the
  // directory is missing or not writable, or its file system lacks the bytes.
  DiskStateStore(const std::string& dir, std::vector<DiskRecord> records,
                 const DiskStateStoreOptions& options = {});
  // Finishes every queued transfer, stops the threads and closes the file, which frees its space.
  ~DiskStateStore();
  DiskStateStore(const DiskStateStore&) = delete;
  DiskStateStore& operator=(const DiskStateStore&) = delete;

  // What the store allocates on the host: one chunk-sized bounce buffer for read_parts and
  // write_parts (and the probe of direct I/O at construction). The file is disk_usage's.
  static BufferList buffers(const DiskStateStoreOptions& options = {});
  static DiskUsage disk_usage(const std::string& dir, const std::vector<DiskRecord>& records);

  // Reads the whole record into `dst` (layout(record).bytes, kDiskAlignment-aligned), or writes
  // it from `src`, asynchronously.
  [[nodiscard]] DiskTicket read(size_t record, void* dst);
  [[nodiscard]] DiskTicket write(size_t record, const void* src);
  // The same, returning when done.
  void read_now(size_t record, void* dst) { read(record, dst).wait(); }
  void write_now(size_t record, const void* src) { write(record, src).wait(); }

  // Synchronous copies between the record and three separate arrays of layout(record).count
  // floats, anywhere in memory (no alignment needed), through the bounce buffer: for the initial
  // fill and for export. write_parts takes null m or v as zeros; read_parts skips a null part.
  // For records of fp32 moments.
  void write_parts(size_t record, const float* params, const float* m, const float* v);
  void read_parts(size_t record, float* params, float* m, float* v);
  // The same for records of compact moments: `moments` holds layout(record).moment_bytes (null:
  // zeros, a fresh optimizer, when writing; skipped when reading).
  void write_parts(size_t record, const float* params, const void* moments);
  void read_parts(size_t record, float* params, void* moments);

  // Writes back what buffered I/O holds in the page cache and drops this file's pages from it,
  // so the next reads come from the disk (bench-disk; nothing for direct I/O to do).
  void drop_cached_pages();

  size_t record_count() const { return records_.size(); }
  const DiskRecord& record(size_t index) const { return records_.at(index); }
  const DiskRecordLayout& layout(size_t index) const { return layouts_.at(index); }
  size_t file_offset(size_t index) const { return offsets_.at(index); }
  size_t file_bytes() const { return file_bytes_; }
  // The name the file had in the directory (it is unlinked right after it is created).
  const std::string& path() const { return path_; }
  bool direct_io() const { return direct_io_; }
  // "direct I/O (O_DIRECT)", or "buffered I/O (...why...)".
  const std::string& io_mode() const { return io_mode_; }
  int io_threads() const { return static_cast<int>(threads_.size()); }
  // One line: the records, the bytes, the file, the I/O mode, threads and chunks.
  std::string describe() const;

 private:
  struct Chunk {
    std::shared_ptr<DiskTransfer> transfer;
    size_t file_offset;
    std::byte* data;
    size_t bytes;
  };

  DiskTicket submit(DiskOp op, size_t record, std::byte* data);
  // write_parts and read_parts: one array per part of the record's layout.
  void write_record_parts(size_t record, const std::vector<const std::byte*>& parts);
  void read_record_parts(size_t record, const std::vector<std::byte*>& parts);
  // pread/pwrite of one chunk until done; "" or the message of what failed.
  std::string transfer_chunk(DiskOp op, size_t record, size_t file_offset, std::byte* data,
                             size_t bytes) const;
  void claim(size_t record, const char* what);
  void run_io_thread();
  void close_file() noexcept;

  std::string dir_;
  std::string path_;
  std::vector<DiskRecord> records_;
  std::vector<DiskRecordLayout> layouts_;
  std::vector<size_t> offsets_;
  size_t file_bytes_ = 0;
  DiskStateStoreOptions options_;
  int fd_ = -1;
  bool direct_io_ = false;
  std::string io_mode_;

  // One flag per record: a transfer of it is in flight.
  std::unique_ptr<std::atomic<bool>[]> busy_;

  std::mutex bounce_mutex_;  // read_parts and write_parts share the bounce buffer
  struct FreeBytes {
    void operator()(std::byte* data) const;
  };
  std::unique_ptr<std::byte[], FreeBytes> bounce_;

  std::mutex queue_mutex_;
  std::condition_variable queue_ready_;
  std::deque<Chunk> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace layup
