// The disk tier's store on this machine's temp directory: bitwise round trips, concurrent
// transfers, its file's life, and the errors a user meets (a missing or full disk, a failed
// request) with what they name.
#include "tier/disk_state_store.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include "core/error.h"
#include "io/test_files.h"
#include "tier/disk_space.h"

namespace layup {
namespace {

namespace fs = std::filesystem;
using test_files::contains;
using test_files::error_message;

struct FreeDeleter {
  void operator()(void* data) const { std::free(data); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

AlignedBuffer aligned(size_t bytes) {
  return AlignedBuffer(static_cast<std::byte*>(std::aligned_alloc(kDiskAlignment, bytes)));
}

// Random bits, NaN payloads and denormals included: the store must move bytes, not floats.
void fill_random(std::byte* data, size_t bytes, uint32_t seed) {
  std::mt19937 random(seed);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t word = random();
    std::memcpy(data + i, &word, 4);
  }
}

bool same_bytes(const std::byte* a, const std::byte* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;  // an empty vector's data may be null
}

// The files in `dir` (the store's file is unlinked, so there should be none).
size_t files_in(const std::string& dir) {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir)) ++count;
  return count;
}

// Open descriptors of this process whose target names `path` (an unlinked file reads
// "<path> (deleted)").
int descriptors_on(const std::string& path) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const fs::path target = fs::read_symlink(entry.path(), error);
    if (!error && target.string().starts_with(path)) ++count;
  }
  return count;
}

// Sizes around the 4096-byte alignment and across several 64 KiB chunks.
std::vector<DiskRecord> mixed_records() {
  return {{1, "embeddings"}, {1023, "block 0"}, {1024, "block 1"},
          {1025, "block 2"}, {100003, ""},      {3 * 16384, "final norm"}};
}

DiskStateStoreOptions small_chunks(int threads = 3) {
  DiskStateStoreOptions options;
  options.io_threads = threads;
  options.chunk_bytes = 64 << 10;
  return options;
}

TEST(DiskRecordLayout, PartsAndRecordsStartAlignedForDirectIo) {
  for (size_t count : {size_t{1}, size_t{1023}, size_t{1024}, size_t{1025}, size_t{7077888}}) {
    const DiskRecordLayout layout = disk_record_layout(count);
    EXPECT_EQ(layout.count, count);
    EXPECT_GE(layout.part_floats, count);
    EXPECT_EQ(layout.part_floats * sizeof(float) % kDiskAlignment, 0u);
    EXPECT_LT(layout.part_floats - count, kDiskAlignment / sizeof(float));
    EXPECT_EQ(layout.bytes, 3 * layout.part_floats * sizeof(float));
    EXPECT_EQ(layout.v_offset(), 2 * layout.m_offset());
  }
  EXPECT_EQ(disk_record_layout(1024).bytes, 3u * 4096);
  EXPECT_EQ(disk_record_layout(1025).bytes, 3u * 8192);
}

TEST(DiskStagingRing, SlotsHoldTheLargestRecordAndListAsHostBuffers) {
  const std::vector<DiskRecord> records = mixed_records();
  const DiskStagingRing ring = disk_staging_ring(records, 3);
  EXPECT_EQ(ring.slot_bytes, disk_record_layout(100003).bytes);
  EXPECT_EQ(ring.alignment, kDiskAlignment);
  EXPECT_EQ(ring.bytes(), 3 * ring.slot_bytes);
  const BufferList buffers = disk_staging_buffers(ring, MemoryKind::kPinnedMapped);
  ASSERT_EQ(buffers.size(), 3u);
  for (const PlannedAllocation& buffer : buffers) {
    EXPECT_EQ(buffer.side, MemorySide::kHost);
    EXPECT_EQ(buffer.kind, MemoryKind::kPinnedMapped);
    EXPECT_EQ(buffer.bytes, ring.slot_bytes);
  }
  const BufferList own = DiskStateStore::buffers(small_chunks());
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0].bytes, size_t{64} << 10);
  const DiskUsage usage = DiskStateStore::disk_usage("/data", records);
  EXPECT_EQ(usage.bytes, disk_state_bytes(records));
  EXPECT_EQ(usage.dir, "/data");
}

TEST(DiskStateStore, RecordsOfDifferentSizesRoundTripBitwise) {
  test_files::TempDir dir;
  const std::vector<DiskRecord> records = mixed_records();
  DiskStateStore store(dir.path(), records, small_chunks());
  EXPECT_EQ(store.file_bytes(), disk_state_bytes(records));
  EXPECT_EQ(store.record_count(), records.size());
  EXPECT_EQ(store.record(4).name, "record 4");  // the default name
  std::vector<AlignedBuffer> written, read;
  std::vector<DiskTicket> tickets;
  for (size_t r = 0; r < records.size(); ++r) {
    EXPECT_EQ(store.file_offset(r) % kDiskAlignment, 0u);
    if (r > 0) {
      EXPECT_EQ(store.file_offset(r), store.file_offset(r - 1) + store.layout(r - 1).bytes);
    }
    written.push_back(aligned(store.layout(r).bytes));
    fill_random(written.back().get(), store.layout(r).bytes, static_cast<uint32_t>(r + 1));
    tickets.push_back(store.write(r, written.back().get()));
  }
  for (DiskTicket& ticket : tickets) ticket.wait();
  // Backwards, so no record is read from where the one before it ended.
  for (size_t r = records.size(); r-- > 0;) {
    read.insert(read.begin(), aligned(store.layout(r).bytes));
    store.read_now(r, read.front().get());
  }
  for (size_t r = 0; r < records.size(); ++r)
    EXPECT_TRUE(same_bytes(written[r].get(), read[r].get(), store.layout(r).bytes))
        << "record " << r;
}

TEST(DiskStateStore, PartsFromAnywhereInMemoryRoundTripWithZeroMomentsAndPadding) {
  test_files::TempDir dir;
  DiskStateStore store(dir.path(), {{1025, "block 0"}, {70001, "block 1"}}, small_chunks());
  for (size_t r = 0; r < 2; ++r) {
    const size_t count = store.layout(r).count;
    // One float past an aligned start: nothing the caller hands over needs to be aligned.
    std::vector<float> params(count + 1), m(count + 1), v(count + 1);
    fill_random(reinterpret_cast<std::byte*>(params.data() + 1), count * 4, 7);
    fill_random(reinterpret_cast<std::byte*>(m.data() + 1), count * 4, 8);
    store.write_parts(r, params.data() + 1, r == 0 ? m.data() + 1 : nullptr, nullptr);

    std::vector<float> params_back(count + 1), m_back(count + 1, 1.0f), v_back(count + 1, 1.0f);
    store.read_parts(r, params_back.data() + 1, m_back.data() + 1, v_back.data() + 1);
    EXPECT_EQ(std::memcmp(params.data() + 1, params_back.data() + 1, count * 4), 0);
    if (r == 0) {
      EXPECT_EQ(std::memcmp(m.data() + 1, m_back.data() + 1, count * 4), 0);
    }
    for (size_t i = 1; i <= count; ++i) {
      if (r == 1) {
        ASSERT_EQ(m_back[i], 0.0f);
      }
      ASSERT_EQ(v_back[i], 0.0f);
    }
    // The whole record as a staging slot sees it: each part where the layout says, padding zero.
    const DiskRecordLayout& layout = store.layout(r);
    AlignedBuffer slot = aligned(layout.bytes);
    store.read_now(r, slot.get());
    const float* floats = reinterpret_cast<const float*>(slot.get());
    EXPECT_EQ(std::memcmp(floats + layout.params_offset(), params.data() + 1, count * 4), 0);
    for (size_t i = count; i < layout.part_floats; ++i) ASSERT_EQ(floats[i], 0.0f);
    // A part left out of read_parts is not touched.
    std::vector<float> only_v(count, 5.0f);
    store.read_parts(r, nullptr, nullptr, only_v.data());
    EXPECT_EQ(only_v[0], 0.0f);
  }
}

// Compact moments (bf16, 8bit) are one part after the params, of exactly their bytes, padded to
// the alignment: a record is smaller than fp32's three parts.
TEST(DiskRecordLayout, CompactMomentsAreOnePartOfTheirBytes) {
  for (size_t count : {size_t{1}, size_t{1025}, size_t{70001}}) {
    const DiskRecordLayout fp32 = disk_record_layout(count);
    for (const OptimizerStateKind kind :
         {OptimizerStateKind::kBf16, OptimizerStateKind::kBlockwise8Bit}) {
      const DiskRecordLayout layout = disk_record_layout(count, kind);
      EXPECT_EQ(layout.parts(), 2u);
      EXPECT_EQ(layout.part_floats, fp32.part_floats);
      EXPECT_EQ(layout.moment_bytes % sizeof(float), 0u);
      EXPECT_GE(layout.moment_bytes, optimizer_moments_bytes(kind, count));
      EXPECT_LT(layout.moment_bytes, optimizer_moments_bytes(kind, count) + sizeof(float));
      EXPECT_EQ(layout.part_offset(1), layout.m_offset() * sizeof(float));
      EXPECT_EQ(layout.bytes % kDiskAlignment, 0u);
      EXPECT_GE(layout.bytes, layout.part_offset(1) + layout.moment_bytes);
      EXPECT_LT(layout.bytes, layout.part_offset(1) + layout.moment_bytes + kDiskAlignment);
      EXPECT_LT(layout.bytes, fp32.bytes);
    }
  }
  EXPECT_EQ(disk_record_layout(4096, OptimizerStateKind::kBf16).bytes, 4u * 4096 + 4u * 4096);
}

TEST(DiskStateStore, CompactMomentsRoundTripAsOnePart) {
  test_files::TempDir dir;
  const OptimizerStateKind kind = OptimizerStateKind::kBlockwise8Bit;
  DiskStateStore store(dir.path(), {{1025, "block 0", kind}, {70001, "block 1", kind}},
                       small_chunks());
  for (size_t r = 0; r < 2; ++r) {
    const DiskRecordLayout& layout = store.layout(r);
    std::vector<float> params(layout.count);
    std::vector<std::byte> moments(layout.moment_bytes);
    fill_random(reinterpret_cast<std::byte*>(params.data()), params.size() * 4, 9);
    fill_random(moments.data(), moments.size(), 10);
    store.write_parts(r, params.data(), moments.data());
    std::vector<float> params_back(layout.count);
    std::vector<std::byte> moments_back(layout.moment_bytes);
    store.read_parts(r, params_back.data(), moments_back.data());
    EXPECT_EQ(std::memcmp(params.data(), params_back.data(), params.size() * 4), 0);
    EXPECT_EQ(std::memcmp(moments.data(), moments_back.data(), moments.size()), 0);
    // A fresh optimizer: zero moments. fp32's parts are refused for a compact record.
    store.write_parts(r, params.data(), nullptr);
    store.read_parts(r, nullptr, moments_back.data());
    for (const std::byte byte : moments_back) ASSERT_EQ(byte, std::byte{0});
    EXPECT_THROW(store.read_parts(r, params_back.data(), nullptr, nullptr), Error);
  }
}

// A record may hold the moments of fewer floats than its params (ZeRO-1: a rank keeps a span's
// whole weights and its part of the moments, perhaps none): the moments' parts shrink to theirs,
// each still 4096-aligned; unset, the moments are the params' count.
TEST(DiskRecordLayout, MomentsOfAPartFollowWholeParams) {
  const DiskRecordLayout fp32 = disk_record_layout(70001, OptimizerStateKind::kFp32, 1025);
  EXPECT_EQ(fp32.count, 70001u);
  EXPECT_EQ(fp32.moment_count, 1025u);
  EXPECT_EQ(fp32.part_floats, disk_record_layout(70001).part_floats);
  EXPECT_EQ(fp32.moment_part_floats, 2048u);  // 1025 floats, rounded up to 8192 bytes
  EXPECT_EQ(fp32.v_offset(), fp32.m_offset() + 2048);
  EXPECT_EQ(fp32.part_offset(2), fp32.v_offset() * sizeof(float));
  EXPECT_EQ(fp32.part_data_bytes(0), 70001u * 4);
  EXPECT_EQ(fp32.part_data_bytes(2), 1025u * 4);
  EXPECT_EQ(fp32.bytes, (fp32.part_floats + 2 * 2048) * sizeof(float));
  const DiskRecordLayout none = disk_record_layout(1024, OptimizerStateKind::kFp32, 0);
  EXPECT_EQ(none.bytes, 4096u);  // the params alone
  const DiskRecordLayout coded = disk_record_layout(70001, OptimizerStateKind::kBlockwise8Bit, 512);
  EXPECT_EQ(coded.moment_bytes, optimizer_moments_padded_bytes(coded.kind, 512));
  EXPECT_EQ(coded.bytes, coded.part_floats * sizeof(float) + 4096);
  const DiskRecord whole{1025, "block 0"};
  EXPECT_EQ(whole.moments(), 1025u);
  EXPECT_EQ(disk_record_layout(whole).bytes, disk_record_layout(1025).bytes);
  const std::vector<DiskRecord> parts = {{1025, "", OptimizerStateKind::kFp32, 10},
                                         {70001, "", OptimizerStateKind::kFp32, 70001}};
  EXPECT_EQ(disk_state_bytes(parts), disk_record_layout(1025, OptimizerStateKind::kFp32, 10).bytes +
                                         disk_record_layout(70001).bytes);
  EXPECT_EQ(disk_staging_ring(parts, 2).slot_bytes, disk_record_layout(70001).bytes);
}

TEST(DiskStateStore, ARecordWithFewerMomentsThanParamsRoundTrips) {
  test_files::TempDir dir;
  const OptimizerStateKind coded = OptimizerStateKind::kBlockwise8Bit;
  DiskStateStore store(dir.path(),
                       {{70001, "block 0", OptimizerStateKind::kFp32, 1025},
                        {1025, "block 1", OptimizerStateKind::kFp32, 0},
                        {70001, "block 2", coded, 768}},
                       small_chunks());
  EXPECT_EQ(store.record(0).moments(), 1025u);
  EXPECT_THROW(DiskStateStore(dir.path(), {{10, "block 0", OptimizerStateKind::kFp32, 11}}),
               Error);  // more moments than params
  for (size_t r = 0; r < 3; ++r) {
    SCOPED_TRACE("record " + std::to_string(r));
    const DiskRecordLayout& layout = store.layout(r);
    const bool fp32 = layout.kind == OptimizerStateKind::kFp32;
    // fp32: m and v, each a part; compact: one part of their coded bytes.
    std::vector<float> params(layout.count), m(fp32 ? layout.moment_count : 0),
        v(fp32 ? layout.moment_count : 0);
    std::vector<std::byte> moments(layout.moment_bytes);
    fill_random(reinterpret_cast<std::byte*>(params.data()), params.size() * 4, 11);
    fill_random(reinterpret_cast<std::byte*>(m.data()), m.size() * 4, 12);
    fill_random(reinterpret_cast<std::byte*>(v.data()), v.size() * 4, 13);
    fill_random(moments.data(), moments.size(), 14);
    if (fp32)
      store.write_parts(r, params.data(), m.data(), v.data());
    else
      store.write_parts(r, params.data(), moments.data());
    std::vector<float> params_back(layout.count), m_back(m.size()), v_back(v.size());
    std::vector<std::byte> moments_back(layout.moment_bytes);
    if (fp32)
      store.read_parts(r, params_back.data(), m_back.data(), v_back.data());
    else
      store.read_parts(r, params_back.data(), moments_back.data());
    EXPECT_TRUE(same_bytes(reinterpret_cast<std::byte*>(params.data()),
                           reinterpret_cast<std::byte*>(params_back.data()), params.size() * 4));
    EXPECT_TRUE(same_bytes(reinterpret_cast<std::byte*>(m.data()),
                           reinterpret_cast<std::byte*>(m_back.data()), m.size() * 4));
    EXPECT_TRUE(same_bytes(reinterpret_cast<std::byte*>(v.data()),
                           reinterpret_cast<std::byte*>(v_back.data()), v.size() * 4));
    EXPECT_TRUE(same_bytes(moments.data(), moments_back.data(), moments.size()));
    // The whole record, as a staging slot reads and writes it: each part where the layout says.
    AlignedBuffer slot = aligned(layout.bytes);
    store.read_now(r, slot.get());
    const float* floats = reinterpret_cast<const float*>(slot.get());
    EXPECT_TRUE(same_bytes(reinterpret_cast<const std::byte*>(floats + layout.params_offset()),
                           reinterpret_cast<std::byte*>(params.data()), params.size() * 4));
    if (fp32) {
      EXPECT_TRUE(same_bytes(reinterpret_cast<const std::byte*>(floats + layout.m_offset()),
                             reinterpret_cast<std::byte*>(m.data()), m.size() * 4));
      EXPECT_TRUE(same_bytes(reinterpret_cast<const std::byte*>(floats + layout.v_offset()),
                             reinterpret_cast<std::byte*>(v.data()), v.size() * 4));
    } else {
      EXPECT_TRUE(same_bytes(reinterpret_cast<const std::byte*>(floats + layout.m_offset()),
                             moments.data(), moments.size()));
    }
    fill_random(slot.get(), layout.bytes, 15);
    store.write_now(r, slot.get());
    AlignedBuffer again = aligned(layout.bytes);
    store.read_now(r, again.get());
    EXPECT_TRUE(same_bytes(slot.get(), again.get(), layout.bytes));
  }
  EXPECT_EQ(store.file_bytes(), store.file_offset(2) + store.layout(2).bytes);
}

TEST(DiskStateStore, ConcurrentTransfersOfDifferentRecordsFromManyThreads) {
  test_files::TempDir dir;
  std::vector<DiskRecord> records;
  for (int r = 0; r < 8; ++r) records.push_back({size_t{50000} + 4097 * r, ""});
  DiskStateStore store(dir.path(), records, small_chunks(4));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(records.size(), 0);
  // Each thread owns one record and writes then reads it back ten times with new contents,
  // while the others do the same with theirs.
  for (size_t r = 0; r < records.size(); ++r) {
    threads.emplace_back([&, r] {
      const size_t bytes = store.layout(r).bytes;
      AlignedBuffer out = aligned(bytes), in = aligned(bytes);
      for (uint32_t round = 0; round < 10; ++round) {
        fill_random(out.get(), bytes, static_cast<uint32_t>(r * 100 + round));
        DiskTicket written = store.write(r, out.get());
        written.wait();
        store.read(r, in.get()).wait();
        if (!same_bytes(out.get(), in.get(), bytes)) ++mismatches[r];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t r = 0; r < records.size(); ++r) EXPECT_EQ(mismatches[r], 0) << "record " << r;
}

TEST(DiskStateStore, BufferedIoWhenAskedRoundTripsToo) {
  test_files::TempDir dir;
  DiskStateStoreOptions options = small_chunks();
  options.direct_io = false;
  DiskStateStore store(dir.path(), mixed_records(), options);
  EXPECT_FALSE(store.direct_io());
  EXPECT_TRUE(contains(store.io_mode(), "buffered I/O (asked for)"));
  const size_t bytes = store.layout(4).bytes;
  AlignedBuffer out = aligned(bytes), in = aligned(bytes);
  fill_random(out.get(), bytes, 3);
  store.write_now(4, out.get());
  store.drop_cached_pages();
  store.read_now(4, in.get());
  EXPECT_TRUE(same_bytes(out.get(), in.get(), bytes));
  EXPECT_TRUE(contains(store.describe(), "6 spans on disk"));
}

TEST(DiskStateStore, TheFileIsUnlinkedAtOnceAndClosedAtDestruction) {
  test_files::TempDir dir;
  std::string path;
  {
    DiskStateStore store(dir.path(), mixed_records(), small_chunks());
    path = store.path();
    EXPECT_TRUE(contains(path, dir.path() + "/layup-optimizer-state-" + std::to_string(getpid())));
    // Nothing in the directory to leave behind, but the file is held open (and its space taken).
    EXPECT_EQ(files_in(dir.path()), 0u);
    EXPECT_EQ(descriptors_on(path), 1);
  }
  EXPECT_EQ(descriptors_on(path), 0);
  EXPECT_EQ(files_in(dir.path()), 0u);
}

TEST(DiskStateStore, TwoStoresInOneDirectoryHaveTheirOwnFiles) {
  test_files::TempDir dir;
  DiskStateStore first(dir.path(), {{1000, ""}}, small_chunks());
  DiskStateStore second(dir.path(), {{1000, ""}}, small_chunks());
  EXPECT_NE(first.path(), second.path());
  // Ranks sharing a directory name their files (each rank a process of its own, with its pid).
  DiskStateStoreOptions tagged = small_chunks();
  tagged.file_tag = "rank1";
  DiskStateStore rank_one(dir.path(), {{1000, ""}}, tagged);
  EXPECT_NE(rank_one.path().find("layup-optimizer-state-rank1-"), std::string::npos)
      << rank_one.path();
  EXPECT_NE(rank_one.describe().find("rank1"), std::string::npos);
}

TEST(DiskStateStore, ASecondTransferOfARecordInFlightAndAnUnalignedBufferAreRefused) {
  test_files::TempDir dir;
  DiskStateStoreOptions options = small_chunks(1);
  // Holds the only I/O thread in its first request until released, so the first transfer is
  // certainly still in flight when the second is asked for.
  std::atomic<bool> release{false};
  options.fault_for_tests = [&](size_t, DiskOp, size_t) {
    while (!release.load()) std::this_thread::yield();
    return 0;
  };
  DiskStateStore store(dir.path(), {{70000, "block 3"}, {1000, "block 4"}}, options);
  AlignedBuffer slot = aligned(store.layout(0).bytes);
  DiskTicket first = store.write(0, slot.get());
  EXPECT_TRUE(contains(error_message([&] { store.read_now(0, slot.get()); }),
                       "cannot read the optimizer state of block 3 on disk: a transfer of it is "
                       "still in flight; wait for its ticket first"));
  EXPECT_FALSE(first.done());
  release = true;
  first.wait();
  EXPECT_TRUE(first.done());
  store.read_now(0, slot.get());  // free again once waited for
  EXPECT_TRUE(contains(error_message([&] { store.read_now(1, slot.get() + 16); }),
                       "direct I/O needs buffers aligned to 4096 bytes"));
  EXPECT_TRUE(contains(error_message([&] { store.read_now(2, slot.get()); }),
                       "the disk tier has 2 records; cannot read record 2"));
}

TEST(DiskStateStore, AMissingDirectoryOrAFileInItsPlaceIsNamed) {
  test_files::TempDir dir;
  const std::string missing = dir.file("no-such-dir");
  std::string message = error_message([&] { DiskStateStore store(missing, {{1000, ""}}); });
  EXPECT_TRUE(contains(message, "cannot use " + missing + " for the optimizer state on disk"));
  EXPECT_TRUE(contains(message, "No such file or directory"));
  EXPECT_TRUE(contains(message, "mkdir -p " + missing));

  const std::string file = dir.file("a-file");
  test_files::write_text(file, "x");
  message = error_message([&] { DiskStateStore store(file, {{1000, ""}}); });
  EXPECT_TRUE(contains(message, file + " for the optimizer state on disk: it is not a directory"));
}

TEST(DiskStateStore, ADirectoryThatIsNotWritableIsNamed) {
  test_files::TempDir dir;
  const std::string locked = dir.file("locked");
  fs::create_directory(locked);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(locked.c_str(), W_OK) == 0) {
    fs::permissions(locked, fs::perms::owner_all);
    GTEST_SKIP() << "this process may write anywhere (root): no directory is unwritable to it";
  }
  const std::string message = error_message([&] { DiskStateStore store(locked, {{1000, ""}}); });
  fs::permissions(locked, fs::perms::owner_all);
  EXPECT_TRUE(contains(message, "cannot create " + locked + "/layup-optimizer-state-"));
  EXPECT_TRUE(contains(message, "Permission denied"));
  EXPECT_TRUE(contains(message, "check that " + locked + " is writable"));
}

TEST(DiskStateStore, AFileSystemTooSmallFailsAtConstructionNamingTheBytes) {
  test_files::TempDir dir;
  // One span larger than the free space by 1 GiB: refused before a byte is written.
  const size_t free = disk_free_bytes(dir.path());
  const std::vector<DiskRecord> records = {{(free + (size_t{1} << 30)) / 12, "block 0"}};
  const size_t needed = disk_state_bytes(records);
  const std::string message =
      error_message([&] { DiskStateStore store(dir.path(), records, small_chunks()); });
  EXPECT_TRUE(contains(
      message, "the optimizer state of 1 spans needs " + std::to_string(needed) + " bytes"));
  EXPECT_TRUE(contains(message, "in " + dir.path() + " but its file system has only "));
  EXPECT_TRUE(contains(message, "give another --offload-dir"));
  EXPECT_EQ(files_in(dir.path()), 0u);
}

TEST(DiskStateStore, AFailedWriteOrReadSurfacesAtTheWaitNamingTheFileAndTheSpan) {
  test_files::TempDir dir;
  DiskStateStoreOptions options = small_chunks(2);
  // EIO on the third request of record 1, whichever direction.
  std::atomic<size_t> fail_at{0};
  options.fault_for_tests = [&](size_t record, DiskOp, size_t offset) {
    return record == 1 && offset == fail_at.load() ? EIO : 0;
  };
  DiskStateStore store(dir.path(), {{1000, "block 0"}, {100000, "block 1"}}, options);
  fail_at = store.file_offset(1) + 2 * (64 << 10);
  AlignedBuffer slot = aligned(store.layout(1).bytes);
  fill_random(slot.get(), store.layout(1).bytes, 1);
  DiskTicket ticket = store.write(1, slot.get());
  std::string message = error_message([&] { ticket.wait(); });
  EXPECT_TRUE(contains(message,
                       "cannot write the optimizer state of block 1 (disk tier record 1, "
                       "65536 bytes at offset " +
                           std::to_string(fail_at.load()) + ", 0 done) to " + store.path() +
                           " (unlinked, held open): Input/output error"));
  EXPECT_TRUE(contains(message, "check the device (dmesg)"));
  message = error_message([&] { store.read_now(1, slot.get()); });
  EXPECT_TRUE(contains(message, "cannot read the optimizer state of block 1"));
  EXPECT_TRUE(contains(message, "from " + store.path()));
  // The other record, and this one once the fault is gone, still work.
  store.read_now(0, slot.get());
  fail_at = 1;
  store.write_now(1, slot.get());
  // A ticket dropped unwaited still waits for its buffer, and says what failed.
  fail_at = store.file_offset(1);
  ::testing::internal::CaptureStderr();
  { DiskTicket dropped = store.write(1, slot.get()); }
  EXPECT_TRUE(contains(::testing::internal::GetCapturedStderr(),
                       "(the transfer's ticket was dropped without wait)"));
}

TEST(DiskStateStore, AKernelErrorAfterAShortWriteSurfacesAtTheWait) {
  test_files::TempDir dir;
  DiskStateStore store(dir.path(), {{1000, "block 0"}, {100000, "block 1"}}, small_chunks(1));
  // A file size limit 3 blocks into record 1's second request: the kernel writes up to it (a
  // short write), then refuses the rest with EFBIG, a real error down the real path.
  const size_t limit = store.file_offset(1) + (64 << 10) + 3 * kDiskAlignment;
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit lowered = saved;
  lowered.rlim_cur = limit;
  auto* const previous = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel's SIGXFSZ kills us
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lowered), 0);
  AlignedBuffer slot = aligned(store.layout(1).bytes);
  DiskTicket ticket = store.write(1, slot.get());
  const std::string message = error_message([&] { ticket.wait(); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  EXPECT_TRUE(contains(message, "cannot write the optimizer state of block 1"));
  EXPECT_TRUE(contains(message, std::to_string(3 * kDiskAlignment) + " done) to " + store.path()));
  EXPECT_TRUE(contains(message, "File too large; the file is larger than this process may write"));
}

TEST(DiskStateStore, BadOptionsAreRefused) {
  test_files::TempDir dir;
  DiskStateStoreOptions options;
  options.io_threads = 0;
  EXPECT_TRUE(contains(error_message([&] {
                         DiskStateStore store(dir.path(), {{1, ""}}, options);
                       }),
                       "1 to 64 I/O threads, not 0"));
  options.io_threads = 2;
  options.chunk_bytes = 1000;
  EXPECT_TRUE(contains(error_message([&] {
                         DiskStateStore store(dir.path(), {{1, ""}}, options);
                       }),
                       "a positive multiple of 4096 bytes, not 1000"));
  EXPECT_TRUE(contains(error_message([&] { DiskStateStore store(dir.path(), {}); }),
                       "needs at least one span"));
  EXPECT_TRUE(contains(error_message([&] {
                         DiskStateStore store(dir.path(), {{0, "block 2"}});
                       }),
                       "block 2 holds no floats"));
}

}  // namespace
}  // namespace layup
