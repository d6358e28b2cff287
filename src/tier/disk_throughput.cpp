// The disk tier's throughput (disk_throughput.h).
#include "tier/disk_throughput.h"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "memory/memory_accountant.h"

namespace layup {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void DiskThroughputBench::FreeDeleter::operator()(std::byte* data) const {
  std::free(data);
}

DiskThroughputBench::DiskThroughputBench(std::string dir, size_t record_floats, size_t count)
    : dir_(std::move(dir)),
      records_(count, DiskRecord{record_floats, ""}),
      record_bytes_(disk_record_layout(record_floats).bytes) {
  LAYUP_CHECK(count > 0 && record_floats > 0, "the disk benchmark needs at least one record");
  for (std::vector<Slot>* slots : {&slots_, &read_slots_})
    for (int i = 0; i < 2; ++i) {
      slots->emplace_back(
          static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, record_bytes_)));
      LAYUP_CHECK(slots->back() != nullptr, "out of host memory allocating two slots of ",
                  format_bytes(record_bytes_), "; try smaller records");
    }
  for (int i = 0; i < 2; ++i) {
    // Not zeros, and not one byte repeated: no file system or device compresses them away.
    auto* words = reinterpret_cast<uint32_t*>(slots_[i].get());
    uint32_t x = 2463534242u + i;
    for (size_t w = 0; w < record_bytes_ / 4; ++w) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      words[w] = x;
    }
    // Touched before any timing, so no page fault of a fresh buffer is counted as disk time.
    std::memset(read_slots_[i].get(), 0, record_bytes_);
  }
}

DiskThroughputBench::~DiskThroughputBench() = default;

DiskThroughput DiskThroughputBench::measure(const DiskStateStoreOptions& options) {
  DiskStateStore store(dir_, records_, options);
  const double bytes = static_cast<double>(store.file_bytes());
  // Passes over the whole file through the two slots, the ticket of a slot waited for before the
  // slot is used again.
  const auto pass = [&](DiskOp op, std::vector<Slot>& buffers) {
    std::vector<DiskTicket> tickets(2);
    for (size_t r = 0; r < records_.size(); ++r) {
      tickets[r % 2].wait();
      tickets[r % 2] = op == DiskOp::kWrite ? store.write(r, buffers[r % 2].get())
                                            : store.read(r, buffers[r % 2].get());
    }
    for (DiskTicket& ticket : tickets) ticket.wait();
  };

  DiskThroughput rates;
  rates.io_mode = store.io_mode();
  auto start = std::chrono::steady_clock::now();
  pass(DiskOp::kWrite, slots_);
  store.drop_cached_pages();
  rates.write_bytes_per_s = bytes / seconds_since(start);

  start = std::chrono::steady_clock::now();
  pass(DiskOp::kRead, read_slots_);
  rates.read_bytes_per_s = bytes / seconds_since(start);
  const size_t count = records_.size();
  const auto check_read_back = [&](size_t r, const std::byte* read) {
    LAYUP_CHECK(std::memcmp(read, slots_[r % 2].get(), record_bytes_) == 0,
                "disk benchmark: record ", r, " read back differs from what was written to ",
                store.path(), "; the disk or the file system lost data");
  };
  for (size_t r = count >= 2 ? count - 2 : 0; r < count; ++r)
    check_read_back(r, read_slots_[r % 2].get());

  // Record r written from slot r % 2, as the first pass wrote it, and record r + count / 2 read:
  // with four records or more, never one that is in flight (the store refuses that).
  if (count < 4) return rates;
  start = std::chrono::steady_clock::now();
  std::vector<DiskTicket> writes(2), reads(2);
  size_t last_read = 0;
  for (size_t r = 0; r < count; ++r) {
    writes[r % 2].wait();
    reads[r % 2].wait();
    last_read = (r + count / 2) % count;
    writes[r % 2] = store.write(r, slots_[r % 2].get());
    reads[r % 2] = store.read(last_read, read_slots_[r % 2].get());
  }
  for (DiskTicket& ticket : writes) ticket.wait();
  for (DiskTicket& ticket : reads) ticket.wait();
  rates.mixed_bytes_per_s = 2.0 * bytes / seconds_since(start);
  check_read_back(last_read, read_slots_[(count - 1) % 2].get());
  return rates;
}

}  // namespace layup
