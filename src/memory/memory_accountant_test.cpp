// The accountant: current and peak bytes per cell, class, side and run; records that give their
// bytes back; the CPU device recording every buffer; thread safety; the report and JSON.
#include "memory/memory_accountant.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "backend/device.h"

namespace layup {
namespace {

TEST(MemoryAccountant, TracksCurrentAndPeakPerCellRowSideAndTotal) {
  MemoryAccountant accountant;
  accountant.add(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice, 100);
  accountant.add(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kPinnedMapped, 50);
  accountant.add(MemorySide::kHost, TensorClass::kMasterWeights, MemoryKind::kHost, 400);
  accountant.remove(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice, 100);
  accountant.add(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice, 30);

  const MemoryUsage cell =
      accountant.cell(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice);
  EXPECT_EQ(cell.current, 30u);
  EXPECT_EQ(cell.peak, 100u);
  const MemoryUsage row = accountant.row(MemorySide::kDevice, TensorClass::kWeightGrads);
  EXPECT_EQ(row.current, 80u);
  EXPECT_EQ(row.peak, 150u);
  EXPECT_EQ(accountant.side_total(MemorySide::kDevice).peak, 150u);
  EXPECT_EQ(accountant.side_total(MemorySide::kHost).current, 400u);
  EXPECT_EQ(accountant.total().current, 480u);
  EXPECT_EQ(accountant.total().peak, 550u);
}

TEST(MemoryAccountant, ReportAndJsonShowTheClassesAndKindsInUse) {
  MemoryAccountant accountant;
  accountant.add(MemorySide::kDevice, TensorClass::kActivations, MemoryKind::kDevice,
                 size_t{3} << 30);
  accountant.add(MemorySide::kHost, TensorClass::kOptimizerMoments, MemoryKind::kHost, 2048);
  const std::string report = accountant.report();
  EXPECT_NE(report.find("activations"), std::string::npos) << report;
  EXPECT_NE(report.find("optimizer moments"), std::string::npos) << report;
  EXPECT_NE(report.find("3.00 GiB"), std::string::npos) << report;
  EXPECT_NE(report.find("2.0 KiB"), std::string::npos) << report;
  EXPECT_EQ(report.find("managed"), std::string::npos) << "unused kinds get no column";

  const nlohmann::json json = nlohmann::json::parse(accountant.to_json_text());
  ASSERT_EQ(json["cells"].size(), 2u);
  EXPECT_EQ(json["cells"][0]["class"], "activations");
  EXPECT_EQ(json["cells"][0]["kind"], "device");
  EXPECT_EQ(json["cells"][0]["side"], "device");
  EXPECT_EQ(json["total"]["peak_bytes"], (size_t{3} << 30) + 2048);
}

// cells() lists every cell that ever held memory (a freed one keeps its peak), device side
// first, in class and kind order: what a caller reads instead of parsing the JSON.
TEST(MemoryAccountant, CellsListWhatEachClassAndKindHeld) {
  MemoryAccountant accountant;
  EXPECT_TRUE(accountant.cells().empty());
  accountant.add(MemorySide::kHost, TensorClass::kOptimizerMoments, MemoryKind::kPinnedMapped, 96);
  accountant.add(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kManaged, 40);
  accountant.add(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kDevice, 8);
  accountant.remove(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kManaged, 40);
  const std::vector<MemoryCell> cells = accountant.cells();
  ASSERT_EQ(cells.size(), 3u);
  EXPECT_EQ(cells[0].side, MemorySide::kDevice);
  EXPECT_EQ(cells[0].tensor_class, TensorClass::kWeightGrads);
  EXPECT_EQ(cells[0].kind, MemoryKind::kDevice);
  EXPECT_EQ(cells[0].usage.peak, 8u);
  EXPECT_EQ(cells[1].kind, MemoryKind::kManaged);
  EXPECT_EQ(cells[1].usage.current, 0u);
  EXPECT_EQ(cells[1].usage.peak, 40u);
  EXPECT_EQ(cells[2].side, MemorySide::kHost);
  EXPECT_EQ(cells[2].tensor_class, TensorClass::kOptimizerMoments);
  EXPECT_EQ(cells[2].usage.peak, 96u);
}

TEST(MemoryAccountant, RecordsGiveTheirBytesBackWhenTheyGo) {
  auto accountant = std::make_shared<MemoryAccountant>();
  {
    MemoryRecord record(accountant, MemorySide::kHost, TensorClass::kScratch,
                        MemoryKind::kPinnedMapped, 64);
    MemoryRecord moved = std::move(record);
    EXPECT_EQ(accountant->total().current, 64u);
  }
  EXPECT_EQ(accountant->total().current, 0u);
  EXPECT_EQ(accountant->total().peak, 64u);
}

TEST(MemoryAccountant, TheCpuDeviceRecordsEveryBufferWhileItLives) {
  auto accountant = std::make_shared<MemoryAccountant>();
  std::unique_ptr<Device> device = make_cpu_device(accountant);
  EXPECT_EQ(device->accountant(), accountant);
  EXPECT_EQ(device->memory_kind(), MemoryKind::kHost);
  {
    DeviceBuffer grads = device->allocate(100, TensorClass::kWeightGrads);
    DeviceBuffer moments = device->allocate(10, TensorClass::kOptimizerMoments);
    EXPECT_EQ(
        accountant->cell(MemorySide::kDevice, TensorClass::kWeightGrads, MemoryKind::kHost).current,
        400u);
    moments = device->allocate(20, TensorClass::kOptimizerMoments);  // the old buffer goes
    EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kOptimizerMoments).current, 80u);
    EXPECT_EQ(accountant->row(MemorySide::kDevice, TensorClass::kOptimizerMoments).peak, 120u);
  }
  EXPECT_EQ(accountant->total().current, 0u);
  // A device made without a ledger has one of its own.
  EXPECT_NE(make_cpu_device()->accountant(), nullptr);
}

TEST(MemoryAccountant, ManyThreadsRecordingAgree) {
  MemoryAccountant accountant;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        accountant.add(MemorySide::kDevice, TensorClass::kScratch, MemoryKind::kDevice, 8);
        accountant.remove(MemorySide::kDevice, TensorClass::kScratch, MemoryKind::kDevice, 8);
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(accountant.total().current, 0u);
  EXPECT_GE(accountant.total().peak, 8u);
  EXPECT_LE(accountant.total().peak, 32u);
}

// The JSON is one snapshot: its totals are the sums of its cells even while other threads
// record (a bench reads it while the layup schedule's threads may still be allocating).
TEST(MemoryAccountant, JsonIsOneSnapshotWhileThreadsRecord) {
  MemoryAccountant accountant;
  std::atomic<bool> done = false;
  std::vector<std::thread> threads;
  // Stops and joins the recorders however the test leaves (a failed ASSERT returns early).
  struct Joiner {
    std::atomic<bool>& done;
    std::vector<std::thread>& threads;
    ~Joiner() {
      done = true;
      for (std::thread& thread : threads) thread.join();
    }
  } joiner{done, threads};
  for (const MemorySide side : {MemorySide::kDevice, MemorySide::kHost})
    threads.emplace_back([&, side] {
      while (!done) {
        accountant.add(side, TensorClass::kScratch, MemoryKind::kPinnedMapped, 8);
        accountant.remove(side, TensorClass::kScratch, MemoryKind::kPinnedMapped, 8);
      }
    });
  for (int read = 0; read < 500; ++read) {
    const nlohmann::json json = nlohmann::json::parse(accountant.to_json_text());
    uint64_t device = 0, host = 0;
    for (const nlohmann::json& cell : json["cells"])
      (cell["side"] == "device" ? device : host) += cell["current_bytes"].get<uint64_t>();
    ASSERT_EQ(json["device_side"]["current_bytes"].get<uint64_t>(), device) << "read " << read;
    ASSERT_EQ(json["host_side"]["current_bytes"].get<uint64_t>(), host) << "read " << read;
    ASSERT_EQ(json["total"]["current_bytes"].get<uint64_t>(), device + host) << "read " << read;
  }
}

TEST(MemoryAccountant, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(8192), "8.0 KiB");
  EXPECT_EQ(format_bytes(size_t{3} << 29), "1.50 GiB");
}

}  // namespace
}  // namespace layup
