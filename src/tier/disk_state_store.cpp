// The disk tier's file: creation, reservation, direct or buffered I/O, and the I/O threads.
#include "tier/disk_state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

// One read or write of one record: its chunks count down, the first failure is kept, and the
// last chunk to finish wakes the ticket's waiter.
struct DiskTransfer {
  size_t record = 0;
  DiskOp op = DiskOp::kRead;
  std::atomic<bool>* busy = nullptr;
  std::atomic<size_t> chunks_left{0};
  std::atomic<bool> failed{false};

  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;  // guarded by mutex
  std::string error;  // guarded by mutex; the first chunk's failure

  void chunk_done(const std::string& failure) {
    if (!failure.empty() && !failed.exchange(true)) {
      std::lock_guard lock(mutex);
      error = failure;
    }
    if (chunks_left.fetch_sub(1) != 1) return;
    // Free the record before waking the waiter, so that it may start the record's next transfer
    // as soon as wait returns.
    busy->store(false);
    std::lock_guard lock(mutex);
    done = true;
    finished.notify_all();
  }
};

namespace {

constexpr int kMaxIoThreads = 64;

size_t round_up(size_t bytes, size_t to) {
  return (bytes + to - 1) / to * to;
}

const char* op_verb(DiskOp op) {
  return op == DiskOp::kRead ? "read" : "write";
}

// What a user can do about an errno of the file's I/O.
std::string advice(int error, const std::string& dir) {
  switch (error) {
    case ENOSPC:
      return "the file system of " + dir +
             " is full although the file's space was reserved when the run started (thin or "
             "copy-on-write storage can do this); free space there or give another --offload-dir";
    case EIO:
      return "the disk reported an I/O error; check the device (dmesg) or give another "
             "--offload-dir";
    case EFBIG:
      return "the file is larger than this process may write (ulimit -f); raise that limit";
    case EINVAL:
      return "the file system refused the request (direct I/O alignment?); give another "
             "--offload-dir";
    default:
      return "check the disk behind " + dir + " or give another --offload-dir";
  }
}

// The free bytes statvfs reports for `dir`, or 0 where it cannot say.
size_t free_bytes_of(const std::string& dir) {
  struct statvfs space;
  if (::statvfs(dir.c_str(), &space) != 0) return 0;
  const size_t block = space.f_frsize != 0 ? space.f_frsize : space.f_bsize;
  return static_cast<size_t>(space.f_bavail) * block;
}

std::byte* allocate_aligned(size_t bytes) {
  auto* data = static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, bytes));
  LAYUP_CHECK(data != nullptr, "out of host memory allocating ", format_bytes(bytes),
              " for the disk tier's bounce buffer");
  return data;
}

// Closes a descriptor unless released: the constructor's cleanup when a later step throws.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

// Clears a record's in-flight flag when a synchronous transfer of it ends, however it ends.
struct ReleaseRecord {
  std::atomic<bool>& busy;
  ~ReleaseRecord() { busy.store(false); }
};

// A name in `dir` no other store (of this or another process) uses: the pid and a counter.
std::atomic<unsigned> next_file_number{0};

}  // namespace

// ---- layout and planning -----------------------------------------------------------------------

DiskRecordLayout disk_record_layout(size_t count, OptimizerStateKind kind,
                                    std::optional<size_t> moment_count) {
  DiskRecordLayout layout;
  layout.count = count;
  layout.moment_count = moment_count.value_or(count);
  layout.kind = kind;
  layout.part_floats = round_up(count * sizeof(float), kDiskAlignment) / sizeof(float);
  if (kind == OptimizerStateKind::kFp32) {
    layout.moment_part_floats =
        round_up(layout.moment_count * sizeof(float), kDiskAlignment) / sizeof(float);
    layout.bytes = (layout.part_floats + 2 * layout.moment_part_floats) * sizeof(float);
  } else {
    layout.moment_bytes =
        round_up(optimizer_moments_bytes(kind, layout.moment_count), sizeof(float));
    layout.bytes =
        layout.part_floats * sizeof(float) + round_up(layout.moment_bytes, kDiskAlignment);
  }
  return layout;
}

size_t disk_state_bytes(const std::vector<DiskRecord>& records) {
  size_t bytes = 0;
  for (const DiskRecord& record : records) bytes += disk_record_layout(record).bytes;
  return bytes;
}

DiskStagingRing disk_staging_ring(const std::vector<DiskRecord>& records, size_t slots) {
  DiskStagingRing ring;
  ring.slots = slots;
  for (const DiskRecord& record : records)
    ring.slot_bytes = std::max(ring.slot_bytes, disk_record_layout(record).bytes);
  return ring;
}

BufferList disk_staging_buffers(const DiskStagingRing& ring, MemoryKind kind) {
  BufferList buffers;
  for (size_t slot = 0; slot < ring.slots; ++slot)
    buffers.push_back({MemorySide::kHost, TensorClass::kOptimizerMoments, kind, ring.slot_bytes,
                       "disk tier staging slot " + std::to_string(slot) +
                           " (master weights and moments of one span)"});
  return buffers;
}

// ---- tickets ------------------------------------------------------------------------------------

DiskTicket& DiskTicket::operator=(DiskTicket&& other) noexcept {
  if (this != &other) {
    wait_quietly();
    transfer_ = std::move(other.transfer_);
  }
  return *this;
}

DiskTicket::~DiskTicket() {
  wait_quietly();
}

void DiskTicket::wait() {
  if (!transfer_) return;
  std::shared_ptr<DiskTransfer> transfer = std::move(transfer_);
  std::unique_lock lock(transfer->mutex);
  transfer->finished.wait(lock, [&] { return transfer->done; });
  if (!transfer->error.empty()) throw Error(transfer->error);
}

bool DiskTicket::done() const {
  if (!transfer_) return true;
  std::lock_guard lock(transfer_->mutex);
  return transfer_->done;
}

void DiskTicket::wait_quietly() noexcept {
  if (!transfer_) return;
  std::unique_lock lock(transfer_->mutex);
  transfer_->finished.wait(lock, [&] { return transfer_->done; });
  // A failure nobody will see otherwise: the data of that record is not what the caller thinks.
  if (!transfer_->error.empty())
    std::fprintf(stderr, "layup: error: %s (the transfer's ticket was dropped without wait)\n",
                 transfer_->error.c_str());
  lock.unlock();
  transfer_.reset();
}

// ---- the store ----------------------------------------------------------------------------------

void DiskStateStore::FreeBytes::operator()(std::byte* data) const {
  std::free(data);
}

DiskStateStore::DiskStateStore(const std::string& dir, std::vector<DiskRecord> records,
                               const DiskStateStoreOptions& options)
    : dir_(dir), records_(std::move(records)), options_(options) {
  LAYUP_CHECK(!records_.empty(), "the disk tier's store needs at least one span to hold");
  LAYUP_CHECK(options_.io_threads >= 1 && options_.io_threads <= kMaxIoThreads,
              "the disk tier takes 1 to ", kMaxIoThreads, " I/O threads, not ",
              options_.io_threads);
  LAYUP_CHECK(options_.chunk_bytes > 0 && options_.chunk_bytes % kDiskAlignment == 0,
              "the disk tier's I/O chunk must be a positive multiple of ", kDiskAlignment,
              " bytes, not ", options_.chunk_bytes);
  for (size_t i = 0; i < records_.size(); ++i) {
    if (records_[i].name.empty()) records_[i].name = "record " + std::to_string(i);
    LAYUP_CHECK(records_[i].count > 0, "the disk tier's ", records_[i].name, " holds no floats");
    LAYUP_CHECK(records_[i].moments() <= records_[i].count, "the disk tier's ", records_[i].name,
                " holds the moments of ", records_[i].moments(), " floats, more than its ",
                records_[i].count);
    layouts_.push_back(disk_record_layout(records_[i]));
    offsets_.push_back(file_bytes_);
    file_bytes_ += layouts_.back().bytes;
  }

  struct stat info;
  LAYUP_CHECK(::stat(dir_.c_str(), &info) == 0, "cannot use ", dir_,
              " for the optimizer state on disk: ", std::strerror(errno), "; create it (mkdir -p ",
              dir_, ") or give another --offload-dir");
  LAYUP_CHECK(S_ISDIR(info.st_mode), "cannot use ", dir_,
              " for the optimizer state on disk: it is not a directory; give a directory as "
              "--offload-dir");
  // Refused before anything is written: fallocate would fail too, but only after taking what
  // space there is.
  const size_t free_before = free_bytes_of(dir_);
  LAYUP_CHECK(file_bytes_ <= free_before, "the optimizer state of ", records_.size(),
              " spans needs ", file_bytes_, " bytes (", format_bytes(file_bytes_), ") in ", dir_,
              " but its file system has only ", free_before, " bytes (", format_bytes(free_before),
              ") free; free space there, give another --offload-dir, or keep fewer spans on disk");

  // O_EXCL and a fresh name: never open another run's file.
  int fd = -1;
  bool opened_direct = false;
  for (int attempt = 0; fd < 0; ++attempt) {
    const std::string tag = options_.file_tag.empty() ? "" : options_.file_tag + "-";
    path_ = (std::filesystem::path(dir_) /
             ("layup-optimizer-state-" + tag + std::to_string(::getpid()) + "-" +
              std::to_string(next_file_number++) + ".bin"))
                .string();
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    opened_direct = options_.direct_io;
    fd = ::open(path_.c_str(), flags | (opened_direct ? O_DIRECT : 0), 0600);
    // Some file systems refuse O_DIRECT at open (EINVAL): buffered I/O there.
    if (fd < 0 && errno == EINVAL && opened_direct) {
      opened_direct = false;
      fd = ::open(path_.c_str(), flags, 0600);
    }
    if (fd < 0 && errno == EEXIST && attempt < 100) continue;
    LAYUP_CHECK(fd >= 0, "cannot create ", path_,
                " for the optimizer state on disk: ", std::strerror(errno), "; check that ", dir_,
                " is writable or give another --offload-dir");
  }
  FdGuard guard{fd};
  // Unlinked at once: the file lives as long as the descriptor, so a crash, a kill or the OOM
  // killer cannot leave tens of GB behind to fail the next run's reservation.
  LAYUP_CHECK(::unlink(path_.c_str()) == 0, "cannot remove the name of ", path_,
              " (the disk tier keeps its file unlinked): ", std::strerror(errno));

  int reserve_error = ::fallocate(fd, 0, 0, static_cast<off_t>(file_bytes_)) == 0 ? 0 : errno;
  if (reserve_error == EOPNOTSUPP) {
    // glibc's posix_fallocate emulates the reservation by writing a byte per block, which
    // direct I/O would refuse: buffered for that moment.
    const int flags = ::fcntl(fd, F_GETFL);
    ::fcntl(fd, F_SETFL, flags & ~O_DIRECT);
    reserve_error = ::posix_fallocate(fd, 0, static_cast<off_t>(file_bytes_));
    ::fcntl(fd, F_SETFL, flags);
  }
  if (reserve_error == ENOSPC) {
    const size_t free_now = free_bytes_of(dir_);
    fail("cannot reserve ", file_bytes_, " bytes (", format_bytes(file_bytes_),
         ") for the optimizer state of ", records_.size(), " spans in ", path_, ": ",
         std::strerror(reserve_error), "; its file system had ", free_before, " bytes (",
         format_bytes(free_before), ") free before and ", free_now,
         " now (another process may be writing there); free space there, give another "
         "--offload-dir, or keep fewer spans on disk");
  }
  LAYUP_CHECK(reserve_error == 0, "cannot reserve ", file_bytes_, " bytes (",
              format_bytes(file_bytes_), ") for the optimizer state in ", path_, ": ",
              std::strerror(reserve_error), "; give another --offload-dir");

  bounce_.reset(allocate_aligned(options_.chunk_bytes));
  std::memset(bounce_.get(), 0, kDiskAlignment);
  direct_io_ = opened_direct;
  if (opened_direct) {
    // Some file systems take O_DIRECT at open and refuse it at the first request (EINVAL): one
    // aligned block of zeros at the start finds out, and F_SETFL turns it off in place.
    ssize_t written = ::pwrite(fd, bounce_.get(), kDiskAlignment, 0);
    if (written < 0 && errno == EINVAL) {
      LAYUP_CHECK(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) == 0,
                  "cannot turn off direct I/O on ", path_, ": ", std::strerror(errno));
      direct_io_ = false;
      written = ::pwrite(fd, bounce_.get(), kDiskAlignment, 0);
    }
    LAYUP_CHECK(written == static_cast<ssize_t>(kDiskAlignment), "cannot write to ", path_, ": ",
                written < 0 ? std::strerror(errno) : "a short write",
                "; check the disk or give another --offload-dir");
    io_mode_ = direct_io_ ? "direct I/O (O_DIRECT)"
                          : "buffered I/O (the file system refuses O_DIRECT requests)";
  } else {
    io_mode_ = options_.direct_io ? "buffered I/O (the file system does not support O_DIRECT)"
                                  : "buffered I/O (asked for)";
  }

  busy_ = std::make_unique<std::atomic<bool>[]>(records_.size());
  for (size_t i = 0; i < records_.size(); ++i) busy_[i].store(false);
  fd_ = fd;
  guard.fd = -1;
  try {
    for (int i = 0; i < options_.io_threads; ++i)
      threads_.emplace_back([this] { run_io_thread(); });
  } catch (...) {
    {
      std::lock_guard lock(queue_mutex_);
      stopping_ = true;
    }
    queue_ready_.notify_all();
    for (std::thread& thread : threads_) thread.join();
    close_file();
    throw;
  }
}

DiskStateStore::~DiskStateStore() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  close_file();
}

void DiskStateStore::close_file() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

BufferList DiskStateStore::buffers(const DiskStateStoreOptions& options) {
  return {{MemorySide::kHost, TensorClass::kScratch, MemoryKind::kHost, options.chunk_bytes,
           "disk tier bounce buffer (filling and exporting spans)", /*accounted=*/false}};
}

DiskUsage DiskStateStore::disk_usage(const std::string& dir,
                                     const std::vector<DiskRecord>& records) {
  return {dir, disk_state_bytes(records)};
}

std::string DiskStateStore::describe() const {
  return "optimizer state of " + std::to_string(records_.size()) +
         " spans on disk: " + format_bytes(file_bytes_) + " in " + path_ +
         " (unlinked, held open), " + io_mode_ + ", " + std::to_string(io_threads()) +
         " I/O threads, " + format_bytes(options_.chunk_bytes) + " requests";
}

void DiskStateStore::claim(size_t record, const char* what) {
  LAYUP_CHECK(record < records_.size(), "the disk tier has ", records_.size(), " records; cannot ",
              what, " record ", record);
  LAYUP_CHECK(!busy_[record].exchange(true), "cannot ", what, " the optimizer state of ",
              records_[record].name,
              " on disk: a transfer of it is still in flight; wait for "
              "its ticket first");
}

DiskTicket DiskStateStore::read(size_t record, void* dst) {
  return submit(DiskOp::kRead, record, static_cast<std::byte*>(dst));
}

DiskTicket DiskStateStore::write(size_t record, const void* src) {
  // The I/O threads only read from it; the cast spares a second chunk type.
  return submit(DiskOp::kWrite, record, static_cast<std::byte*>(const_cast<void*>(src)));
}

DiskTicket DiskStateStore::submit(DiskOp op, size_t record, std::byte* data) {
  // Checked in buffered mode too, so that code tested on tmpfs also runs where O_DIRECT works.
  LAYUP_CHECK(reinterpret_cast<uintptr_t>(data) % kDiskAlignment == 0, "cannot ", op_verb(op),
              " record ", record, " of the disk tier through a buffer at ",
              static_cast<const void*>(data), ": direct I/O needs buffers aligned to ",
              kDiskAlignment, " bytes (see disk_staging_ring)");
  claim(record, op_verb(op));
  const DiskRecordLayout& layout = layouts_[record];
  auto transfer = std::make_shared<DiskTransfer>();
  transfer->record = record;
  transfer->op = op;
  transfer->busy = &busy_[record];
  const size_t chunks = (layout.bytes + options_.chunk_bytes - 1) / options_.chunk_bytes;
  transfer->chunks_left.store(chunks);
  {
    std::lock_guard lock(queue_mutex_);
    for (size_t done = 0; done < layout.bytes; done += options_.chunk_bytes)
      queue_.push_back({transfer, offsets_[record] + done, data + done,
                        std::min(options_.chunk_bytes, layout.bytes - done)});
  }
  queue_ready_.notify_all();
  return DiskTicket(std::move(transfer));
}

void DiskStateStore::run_io_thread() {
  while (true) {
    Chunk chunk;
    {
      std::unique_lock lock(queue_mutex_);
      // Drains the queue before stopping: a queued chunk's buffer belongs to a live ticket.
      queue_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      chunk = std::move(queue_.front());
      queue_.pop_front();
    }
    DiskTransfer& transfer = *chunk.transfer;
    std::string failure;
    // Once one chunk failed the record is lost anyway: skip the rest.
    if (!transfer.failed.load()) {
      failure =
          transfer_chunk(transfer.op, transfer.record, chunk.file_offset, chunk.data, chunk.bytes);
    }
    transfer.chunk_done(failure);
  }
}

std::string DiskStateStore::transfer_chunk(DiskOp op, size_t record, size_t file_offset,
                                           std::byte* data, size_t bytes) const {
  const auto failure = [&](size_t moved_bytes, const std::string& reason) {
    return std::string("cannot ") + op_verb(op) + " the optimizer state of " +
           records_[record].name + " (disk tier record " + std::to_string(record) + ", " +
           std::to_string(bytes) + " bytes at offset " + std::to_string(file_offset) + ", " +
           std::to_string(moved_bytes) + " done) " + (op == DiskOp::kRead ? "from " : "to ") +
           path_ + " (unlinked, held open): " + reason;
  };
  size_t done = 0;
  while (done < bytes) {
    if (options_.fault_for_tests) {
      if (int error = options_.fault_for_tests(record, op, file_offset + done); error != 0)
        return failure(done, std::string(std::strerror(error)) + "; " + advice(error, dir_));
    }
    const off_t at = static_cast<off_t>(file_offset + done);
    const ssize_t moved = op == DiskOp::kRead ? ::pread(fd_, data + done, bytes - done, at)
                                              : ::pwrite(fd_, data + done, bytes - done, at);
    if (moved < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      return failure(done, std::string(std::strerror(error)) + "; " + advice(error, dir_));
    }
    // A short transfer (a signal, a file size limit, a full disk) goes on from where it stopped;
    // one that moves nothing cannot go on.
    if (moved == 0)
      return failure(done, op == DiskOp::kRead
                               ? "the file ended early (was it truncated by something else?)"
                               : "the disk accepted no more bytes; " + advice(ENOSPC, dir_));
    done += static_cast<size_t>(moved);
  }
  return "";
}

void DiskStateStore::write_parts(size_t record, const float* params, const float* m,
                                 const float* v) {
  LAYUP_CHECK(layouts_.at(record).kind == OptimizerStateKind::kFp32,
              "internal error: fp32 moments written to a record of ",
              name_of(layouts_.at(record).kind), " moments");
  write_record_parts(
      record, {reinterpret_cast<const std::byte*>(params), reinterpret_cast<const std::byte*>(m),
               reinterpret_cast<const std::byte*>(v)});
}

void DiskStateStore::write_parts(size_t record, const float* params, const void* moments) {
  LAYUP_CHECK(layouts_.at(record).kind != OptimizerStateKind::kFp32,
              "internal error: compact moments written to a record of fp32 moments");
  write_record_parts(
      record, {reinterpret_cast<const std::byte*>(params), static_cast<const std::byte*>(moments)});
}

void DiskStateStore::read_parts(size_t record, float* params, float* m, float* v) {
  LAYUP_CHECK(layouts_.at(record).kind == OptimizerStateKind::kFp32,
              "internal error: fp32 moments read from a record of ",
              name_of(layouts_.at(record).kind), " moments");
  read_record_parts(record, {reinterpret_cast<std::byte*>(params), reinterpret_cast<std::byte*>(m),
                             reinterpret_cast<std::byte*>(v)});
}

void DiskStateStore::read_parts(size_t record, float* params, void* moments) {
  LAYUP_CHECK(layouts_.at(record).kind != OptimizerStateKind::kFp32,
              "internal error: compact moments read from a record of fp32 moments");
  read_record_parts(record,
                    {reinterpret_cast<std::byte*>(params), static_cast<std::byte*>(moments)});
}

void DiskStateStore::write_record_parts(size_t record, const std::vector<const std::byte*>& parts) {
  LAYUP_CHECK(parts[0] != nullptr, "write_parts needs the master weights of ",
              records_.at(record).name);
  claim(record, "write");
  ReleaseRecord release{busy_[record]};
  std::lock_guard lock(bounce_mutex_);
  std::string failure;
  const DiskRecordLayout& layout = layouts_[record];
  for (size_t part = 0; part < layout.parts() && failure.empty(); ++part) {
    const std::byte* source = parts[part];
    const size_t data_bytes = layout.part_data_bytes(part);
    const size_t part_bytes = round_up(data_bytes, kDiskAlignment);
    for (size_t done = 0; done < part_bytes && failure.empty(); done += options_.chunk_bytes) {
      const size_t bytes = std::min(options_.chunk_bytes, part_bytes - done);
      // The data, then zeros: for a null moment, and for the padding after each part.
      const size_t left = data_bytes - std::min(done, data_bytes);
      const size_t copied = source == nullptr ? 0 : std::min(bytes, left);
      if (copied > 0) std::memcpy(bounce_.get(), source + done, copied);
      std::memset(bounce_.get() + copied, 0, bytes - copied);
      failure =
          transfer_chunk(DiskOp::kWrite, record, offsets_[record] + layout.part_offset(part) + done,
                         bounce_.get(), bytes);
    }
  }
  if (!failure.empty()) throw Error(failure);
}

void DiskStateStore::read_record_parts(size_t record, const std::vector<std::byte*>& parts) {
  claim(record, "read");
  ReleaseRecord release{busy_[record]};
  std::lock_guard lock(bounce_mutex_);
  std::string failure;
  const DiskRecordLayout& layout = layouts_[record];
  for (size_t part = 0; part < layout.parts() && failure.empty(); ++part) {
    std::byte* target = parts[part];
    if (target == nullptr) continue;
    const size_t data_bytes = layout.part_data_bytes(part);
    const size_t part_bytes = round_up(data_bytes, kDiskAlignment);
    for (size_t done = 0; done < data_bytes && failure.empty(); done += options_.chunk_bytes) {
      // Whole aligned blocks from the disk; only the data, not the padding, to the caller.
      const size_t bytes = std::min(options_.chunk_bytes, part_bytes - done);
      failure =
          transfer_chunk(DiskOp::kRead, record, offsets_[record] + layout.part_offset(part) + done,
                         bounce_.get(), bytes);
      if (failure.empty())
        std::memcpy(target + done, bounce_.get(), std::min(bytes, data_bytes - done));
    }
  }
  if (!failure.empty()) throw Error(failure);
}

void DiskStateStore::drop_cached_pages() {
  if (::fdatasync(fd_) != 0) {
    const int error = errno;
    fail("cannot flush ", path_, " (the disk tier's file) to disk: ", std::strerror(error), "; ",
         advice(error, dir_));
  }
  // Advice only: the kernel drops the clean pages it can, and an error here changes nothing.
  (void)::posix_fadvise(fd_, 0, static_cast<off_t>(file_bytes_), POSIX_FADV_DONTNEED);
}

}  // namespace layup
