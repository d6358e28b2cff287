// `layup bench-disk`: how fast the disk tier's store (tier/disk_state_store.h) writes and reads
// span-sized records in --offload-dir, with direct and with buffered I/O, per I/O thread count.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "memory/memory_accountant.h"
#include "tier/disk_space.h"
#include "tier/disk_state_store.h"
#include "tier/disk_throughput.h"

namespace layup {

namespace {

struct DiskBenchFlags {
  std::string dir;
  double gib = 1.0;
  std::vector<int> threads = {1, 2, 4, 8};
  double record_mib = 256.0;  // about one block of a 2B-parameter GPT (12 B/param)
  double chunk_mib = 4.0;
};

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
  DiskThroughputBench bench(flags.dir, record_count_floats, count);
  const DiskSpace space = read_disk_space(flags.dir);
  std::printf("layup bench-disk: %s in %zu records of %s through %s\n",
              format_bytes(count * record_bytes).c_str(), count, format_bytes(record_bytes).c_str(),
              flags.dir.c_str());
  std::printf("  space: %s\n", space.describe().c_str());
  std::printf("  %-9s %7s %12s %12s %12s\n", "I/O", "threads", "write GB/s", "read GB/s",
              "both GB/s");
  std::vector<std::string> notes;
  for (bool direct : {true, false}) {
    for (int threads : flags.threads) {
      DiskStateStoreOptions options;
      options.io_threads = threads;
      options.chunk_bytes =
          static_cast<size_t>(flags.chunk_mib * (1 << 20)) / kDiskAlignment * kDiskAlignment;
      options.direct_io = direct;
      const DiskThroughput rates = bench.measure(options);
      const bool fell_back = direct && rates.io_mode.find("buffered") == 0;
      char both[32] = "-";
      if (rates.mixed_bytes_per_s > 0)
        std::snprintf(both, sizeof both, "%.2f", rates.mixed_bytes_per_s / 1e9);
      std::printf("  %-9s %7d %12.2f %12.2f %12s\n",
                  direct ? (fell_back ? "direct*" : "direct") : "buffered", threads,
                  rates.write_bytes_per_s / 1e9, rates.read_bytes_per_s / 1e9, both);
      if (fell_back && notes.empty()) notes.push_back("* asked for direct, ran " + rates.io_mode);
    }
  }
  for (const std::string& note : notes) std::printf("  %s\n", note.c_str());
  std::printf(
      "  %s requests; GB = 1e9 bytes; buffered writes are timed until fdatasync returns, and the "
      "file's pages are dropped from the page cache before the reads; both: writes and reads "
      "at once, as a step of the disk tier runs them (the bytes of both over their time; needs "
      "four records)\n",
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
