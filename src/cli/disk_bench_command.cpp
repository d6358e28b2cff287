// `layup bench-disk`: how fast the disk tier's store (tier/disk_state_store.h) writes and reads
// span-sized records in --offload-dir, with direct and with buffered I/O, per I/O thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "memory/host_memory_need.h"
#include "memory/memory_accountant.h"
#include "tier/disk_space.h"
#include "tier/disk_state_store.h"
#include "tier/disk_throughput.h"
#include "tier/output_file.h"

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
  // The buffers (two write and two read slots of a record, the store's bounce buffer of a request)
  // and the scratch file, checked before either is made; in doubles, so no size wraps.
  const double mib = 1 << 20, buffers = 4 * flags.record_mib * mib + flags.chunk_mib * mib;
  const HostMemoryLimit machine = read_host_memory_limit();
  const bool chunk_larger = flags.chunk_mib > 4 * flags.record_mib;
  const double room_mib = static_cast<double>(machine.usable_bytes()) / mib;
  check_host_memory_need(
      buffers >= 0x1p64 ? SIZE_MAX : static_cast<size_t>(buffers), machine,
      "bench-disk (4 buffers of --record-mib " + format_flag_value(flags.record_mib) +
          " and 1 of --chunk-mib " + format_flag_value(flags.chunk_mib) + ")",
      chunk_larger
          ? "give --chunk-mib at most " +
                format_flag_value(std::floor(std::max(0.0, room_mib - 4 * flags.record_mib)))
          : "give --record-mib at most " +
                format_flag_value(std::floor(std::max(0.0, room_mib - flags.chunk_mib) / 4)));
  const double scratch = flags.gib * (size_t{1} << 30);
  check_output_folder(flags.dir, "--offload-dir",
                      scratch >= 0x1p64 ? SIZE_MAX : static_cast<size_t>(scratch));
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
  add_path_flag(*cmd, "--offload-dir", flags->dir, "directory",
                "Directory to put the scratch file in")
      ->required();
  add_real_flag(*cmd, "--gib", flags->gib, positive_real(), "GiB to write and read per measurement")
      ->capture_default_str();
  cmd->add_option("--threads", flags->threads, "I/O thread counts to measure, e.g. 1,4,8")
      ->check(whole_validator<int>(from_to(1, 64)))
      ->type_name("counts 1 .. 64, comma-separated")
      ->delimiter(',')
      ->default_str("1,2,4,8");
  add_real_flag(*cmd, "--record-mib", flags->record_mib,
                real_between(1, false, INFINITY, false, "finite number ≥ 1"),
                "MiB of one record (one span's state)")
      ->capture_default_str();
  add_real_flag(*cmd, "--chunk-mib", flags->chunk_mib,
                real_between(kDiskAlignment / 1048576.0, false, INFINITY, false,
                             "finite number ≥ 0.00390625 (4 KiB)"),
                "MiB of one request")
      ->capture_default_str();
  cmd->callback([flags]() { run_disk_bench(*flags); });
}

}  // namespace layup
