// `layup bench-disk`: how fast the disk tier's store (tier/disk_state_store.h) writes and reads
// span-sized records in --offload-dir, with direct and with buffered I/O, per I/O thread count.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "memory/memory_accountant.h"
#include "tier/disk_space.h"
#include "tier/disk_state_store.h"

namespace layup {

namespace {

struct DiskBenchFlags {
  std::string dir;
  double gib = 1.0;
  std::vector<int> threads = {1, 2, 4, 8};
  double record_mib = 256.0;  // about one block of a 2B-parameter GPT (12 B/param)
  double chunk_mib = 4.0;
};

struct FreeDeleter {
  void operator()(std::byte* data) const { std::free(data); }
};
using Slot = std::unique_ptr<std::byte[], FreeDeleter>;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Rates {
  double write_gb_per_s = 0.0, read_gb_per_s = 0.0;
  std::string io_mode;
};

// Writes every record from two slots in turn (two records queued: the I/O threads never wait
// for the caller), then reads them all back the same way; checks the last two that were read.
Rates measure(const DiskBenchFlags& flags, const std::vector<DiskRecord>& records, bool direct,
              int threads, std::vector<Slot>& slots, std::vector<Slot>& read_slots) {
  DiskStateStoreOptions options;
  options.io_threads = threads;
  options.chunk_bytes =
      static_cast<size_t>(flags.chunk_mib * (1 << 20)) / kDiskAlignment * kDiskAlignment;
  options.direct_io = direct;
  DiskStateStore store(flags.dir, records, options);
  const size_t slot_bytes = store.layout(0).bytes;
  const double gb = static_cast<double>(store.file_bytes()) / 1e9;

  // Passes over the whole file through the two slots, the ticket of a slot waited for before the
  // slot is used again.
  const auto pass = [&](DiskOp op, std::vector<Slot>& buffers) {
    std::vector<DiskTicket> tickets(2);
    for (size_t r = 0; r < records.size(); ++r) {
      tickets[r % 2].wait();
      tickets[r % 2] = op == DiskOp::kWrite ? store.write(r, buffers[r % 2].get())
                                            : store.read(r, buffers[r % 2].get());
    }
    for (DiskTicket& ticket : tickets) ticket.wait();
  };

  Rates rates;
  rates.io_mode = store.io_mode();
  auto start = std::chrono::steady_clock::now();
  pass(DiskOp::kWrite, slots);
  // Buffered writes are done only once the disk has them; that also empties the page cache of
  // this file, so the reads below come from the disk.
  store.drop_cached_pages();
  rates.write_gb_per_s = gb / seconds_since(start);

  start = std::chrono::steady_clock::now();
  pass(DiskOp::kRead, read_slots);
  rates.read_gb_per_s = gb / seconds_since(start);
  for (size_t r = records.size() >= 2 ? records.size() - 2 : 0; r < records.size(); ++r)
    LAYUP_CHECK(std::memcmp(read_slots[r % 2].get(), slots[r % 2].get(), slot_bytes) == 0,
                "bench-disk: record ", r, " read back differs from what was written to ",
                store.path(), "; the disk or the file system lost data");
  return rates;
}

void run_disk_bench(const DiskBenchFlags& flags) {
  LAYUP_CHECK(flags.gib > 0, "--gib must be positive, not ", flags.gib);
  LAYUP_CHECK(flags.record_mib >= 1, "--record-mib must be at least 1, not ", flags.record_mib);
  LAYUP_CHECK(flags.chunk_mib * (1 << 20) >= kDiskAlignment, "--chunk-mib must be at least ",
              kDiskAlignment / 1024.0 / 1024.0);
  LAYUP_CHECK(!flags.threads.empty(), "--threads needs at least one count");
  for (int threads : flags.threads)
    LAYUP_CHECK(threads >= 1 && threads <= 64, "--threads takes counts from 1 to 64, not ",
                threads);
  // Records of one span's params, m and v (3 x 4 bytes per parameter) as the disk tier keeps them.
  const size_t record_count_floats = static_cast<size_t>(flags.record_mib * (1 << 20)) / 12;
  const size_t total_bytes = static_cast<size_t>(flags.gib * (size_t{1} << 30));
  const size_t record_bytes = disk_record_layout(record_count_floats).bytes;
  const size_t count = std::max<size_t>(1, (total_bytes + record_bytes - 1) / record_bytes);
  std::vector<DiskRecord> records(count, DiskRecord{record_count_floats, ""});
  const DiskSpace space = read_disk_space(flags.dir);

  std::vector<Slot> slots;
  for (int i = 0; i < 2; ++i) {
    slots.emplace_back(static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, record_bytes)));
    LAYUP_CHECK(slots.back() != nullptr, "out of host memory allocating two slots of ",
                format_bytes(record_bytes), "; try a smaller --record-mib");
    // Not zeros, and not one byte repeated: no file system or device compresses them away.
    auto* words = reinterpret_cast<uint32_t*>(slots.back().get());
    uint32_t x = 2463534242u + i;
    for (size_t w = 0; w < record_bytes / 4; ++w) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      words[w] = x;
    }
  }
  // Touched before any timing, so no page fault of a fresh buffer is counted as disk time.
  std::vector<Slot> read_slots;
  for (int i = 0; i < 2; ++i) {
    read_slots.emplace_back(
        static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, record_bytes)));
    LAYUP_CHECK(read_slots.back() != nullptr, "out of host memory allocating two slots of ",
                format_bytes(record_bytes), "; try a smaller --record-mib");
    std::memset(read_slots.back().get(), 0, record_bytes);
  }
  std::printf("layup bench-disk: %s in %zu records of %s through %s\n",
              format_bytes(count * record_bytes).c_str(), count, format_bytes(record_bytes).c_str(),
              flags.dir.c_str());
  std::printf("  space: %s\n", space.describe().c_str());
  std::printf("  %-9s %7s %12s %12s\n", "I/O", "threads", "write GB/s", "read GB/s");
  std::vector<std::string> notes;
  for (bool direct : {true, false}) {
    for (int threads : flags.threads) {
      const Rates rates = measure(flags, records, direct, threads, slots, read_slots);
      const bool fell_back = direct && rates.io_mode.find("buffered") == 0;
      std::printf("  %-9s %7d %12.2f %12.2f\n",
                  direct ? (fell_back ? "direct*" : "direct") : "buffered", threads,
                  rates.write_gb_per_s, rates.read_gb_per_s);
      if (fell_back && notes.empty()) notes.push_back("* asked for direct, ran " + rates.io_mode);
    }
  }
  for (const std::string& note : notes) std::printf("  %s\n", note.c_str());
  std::printf(
      "  %s requests; GB = 1e9 bytes; buffered writes are timed until fdatasync returns, and the "
      "file's pages are dropped from the page cache before the reads\n",
      format_bytes(static_cast<size_t>(flags.chunk_mib * (1 << 20))).c_str());
}

}  // namespace

void add_disk_bench_command(CLI::App& app) {
  auto flags = std::make_shared<DiskBenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench-disk",
      "Time the disk tier's store: write then read --gib of span-sized records in --offload-dir "
      "with direct and with buffered I/O, per I/O thread count: GB/s.");
  cmd->add_option("--offload-dir", flags->dir, "Directory to put the scratch file in")->required();
  cmd->add_option("--gib", flags->gib, "GiB to write and read per measurement")
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads, "I/O thread counts to measure, e.g. 1,4,8")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--record-mib", flags->record_mib, "MiB of one record (one span's state)")
      ->capture_default_str();
  cmd->add_option("--chunk-mib", flags->chunk_mib, "MiB of one request")->capture_default_str();
  cmd->callback([flags]() { run_disk_bench(*flags); });
}

}  // namespace layup
