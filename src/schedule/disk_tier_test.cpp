// DiskTier's read-ahead: what it reads, reads again and writes back for a run of updates, counted
// by its traffic; the state each update leaves is what the next one finds.
#include "schedule/disk_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/device.h"
#include "core/error.h"
#include "io/test_files.h"
#include "model/model_config.h"
#include "model/parameter_layout.h"
#include "optim/adamw_moments.h"
#include "schedule/optimizer_shards.h"
#include "schedule/packed_moments.h"

namespace layup {
namespace {

// One step's updates of the disk blocks in `order`, one at a time: each read, changed (+1 to
// every parameter), written back and, once its weights have "landed", free.
void update_in_order(DiskTier& tier, const ParameterLayout& layout,
                     const std::vector<size_t>& order) {
  for (const size_t span : order) {
    const DiskTier::Lease lease = tier.take(span);
    for (size_t i = 0; i < layout.spans()[span].count; ++i) lease.params[i] += 1.0f;
    tier.put_back(lease)();  // nothing reads the slot: the weights land at once
  }
}

// Four blocks on disk (the embeddings and the final norm on the host), as the updates of
// `steps` steps of layup with --clip none run them: the blocks top down, one at a time, each
// read, changed (+1 to every parameter), written back and, once its weights have "landed",
// free. Returns the tier's traffic; every parameter must have grown by `steps`.
DiskTraffic update_every_block(size_t slots, int steps) {
  const ParameterLayout layout(gpt2_config(4, 2, 32, 16, 61));
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kDisk);
  sites.front() = sites.back() = UpdateSite::kHost;
  test_files::TempDir dir;
  const std::unique_ptr<Device> device = make_cpu_device();
  DiskTier tier(*device, layout, sites, dir.path(), slots);
  for (const size_t span : tier.spans()) {
    const std::vector<float> params(layout.spans()[span].count, static_cast<float>(span));
    tier.write_span(span, {params.data(), nullptr, nullptr});
  }
  std::vector<size_t> order(tier.spans().rbegin(), tier.spans().rend());
  for (int step = 0; step < steps; ++step) {
    tier.expect(order);
    update_in_order(tier, layout, order);
  }
  for (const size_t span : tier.spans()) {
    std::vector<float> params(layout.spans()[span].count);
    tier.read_span(span, {params.data(), nullptr, nullptr});
    for (const float value : params)
      EXPECT_EQ(value, static_cast<float>(span) + static_cast<float>(steps)) << "span " << span;
  }
  return tier.traffic();
}

// An update whose block is not read yet (its slot still writing the last one back) waits for the
// ring to read it next. Before, the update gave up whatever the ring had started reading for a
// later block and read its own, so a block was read twice: with one slot, most steps did.
TEST(DiskTier, AnUpdateWaitsForItsOwnReadAndNoReadIsGivenUp) {
  for (const size_t slots : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(slots) + " slot(s)");
    for (int repeat = 0; repeat < 20; ++repeat) {  // the ring and the updates race
      const DiskTraffic traffic = update_every_block(slots, 3);
      EXPECT_EQ(traffic.given_up, 0u);
      EXPECT_EQ(traffic.read_on_take, 0u);  // every block was expected
      EXPECT_EQ(traffic.written_back, 12u);
      // Four slots keep every block after its write-back: the first step reads them, no other.
      EXPECT_EQ(traffic.read_ahead, slots == 4 ? 4u : 12u);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Aborts the test binary (a deadlock cannot be failed any other way) unless destroyed within
// `seconds`.
class Watchdog {
 public:
  Watchdog(int seconds, const char* what) {
    thread_ = std::thread([this, seconds, what] {
      std::unique_lock lock(mutex_);
      if (!done_.wait_for(lock, std::chrono::seconds(seconds), [this] { return finished_; })) {
        std::fprintf(stderr, "deadlock: %s did not end in %d s\n", what, seconds);
        std::abort();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
    }
    done_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  bool finished_ = false;
  std::thread thread_;
};

// expect_step: the tier expects the next step's updates in this step's order, so once this
// step's last block is taken its slots are read for the next step's first blocks with nothing
// more said; the next step finds them read (no read on a take, none given up). A next step in
// another order (the timing changed: top down during backward, bottom up after the norm) finds
// both slots reading blocks it does not want first: the ring lets those reads end and reads its
// blocks into their slots, and each block's state is as its last update left it.
TEST(DiskTier, ReadsTheNextStepsFirstBlocksOnceThisStepsLastAreTaken) {
  const ParameterLayout layout(gpt2_config(4, 2, 32, 16, 61));
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kDisk);
  sites.front() = sites.back() = UpdateSite::kHost;
  test_files::TempDir dir;
  const std::unique_ptr<Device> device = make_cpu_device();
  DiskTier tier(*device, layout, sites, dir.path(), 2);
  for (const size_t span : tier.spans()) {
    const std::vector<float> params(layout.spans()[span].count, 0.0f);
    tier.write_span(span, {params.data(), nullptr, nullptr});
  }
  const std::vector<size_t> top_down(tier.spans().rbegin(), tier.spans().rend());
  const std::vector<size_t> bottom_up(tier.spans().begin(), tier.spans().end());
  const auto step = [&](const std::vector<size_t>& order) {
    tier.expect_step(order);
    update_in_order(tier, layout, order);
  };
  const auto wait_for_reads_ahead = [&](size_t count) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (tier.traffic().read_ahead < count && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(tier.traffic().read_ahead, count);
  };
  Watchdog watchdog(120, "a step of the disk tier");
  step(top_down);
  wait_for_reads_ahead(6);  // four for this step, then the next step's first two
  step(top_down);
  EXPECT_EQ(tier.traffic().read_on_take, 0u);
  EXPECT_EQ(tier.traffic().given_up, 0u);
  wait_for_reads_ahead(10);  // the top two again, which the next step does not want first
  step(bottom_up);
  step(top_down);
  for (const size_t span : tier.spans()) {
    std::vector<float> params(layout.spans()[span].count);
    tier.read_span(span, {params.data(), nullptr, nullptr});
    for (const float value : params) ASSERT_EQ(value, 4.0f) << "span " << span;
  }
}

// Bytes: a whole record for each read and write-back and for an import (m and v written as
// zeros), the parts asked for by an export that reads the disk.
TEST(DiskTier, TrafficCountsTheBytesOfRecordsAndParts) {
  const ParameterLayout layout(gpt2_config(4, 2, 32, 16, 61));
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kHost);
  sites[1] = UpdateSite::kDisk;  // block 0
  test_files::TempDir dir;
  const std::unique_ptr<Device> device = make_cpu_device();
  DiskTier tier(*device, layout, sites, dir.path(), 1);
  const size_t count = layout.spans()[1].count;
  const size_t record =
      DiskStateStore::disk_usage(dir.path(), DiskTier::records(layout, sites)).bytes;
  const std::vector<float> twos(count, 2.0f), threes(count, 3.0f);
  tier.write_span(1, {twos.data(), nullptr, nullptr});
  EXPECT_EQ(tier.traffic().bytes_written, record);

  const DiskTier::Lease lease = tier.take(1);  // not expected: read when asked
  EXPECT_EQ(lease.params[0], 2.0f);
  tier.put_back(lease)();
  const DiskTraffic before = tier.traffic();
  EXPECT_EQ(before.read_on_take, 1u);
  EXPECT_EQ(before.read_ahead, 0u);
  EXPECT_EQ(before.written_back, 1u);
  EXPECT_EQ(before.bytes_read, record);
  EXPECT_EQ(before.bytes_written, 2 * record);

  std::vector<float> out(count);
  tier.read_span(1, {out.data(), nullptr, nullptr});  // still in its slot: nothing read
  EXPECT_EQ(out[0], 2.0f);
  tier.write_span(1, {threes.data(), nullptr, nullptr});  // frees the slot: its copy is old
  tier.read_span(1, {out.data(), nullptr, nullptr});      // the params part from the disk
  EXPECT_EQ(out[0], 3.0f);
  const DiskTraffic since = tier.traffic() - before;
  EXPECT_EQ(since.bytes_written, record);
  EXPECT_EQ(since.bytes_read, record / 3);  // params, m and v are equal parts of a record
  EXPECT_EQ(since.read_on_take + since.read_ahead + since.written_back + since.given_up, 0u);
}

// ZeRO-1: each rank's tier keeps every disk span's whole weights and its part of the moments,
// coded from the part's first element. An import keeps that part of the whole span's moments;
// an update's lease holds it; read_moments returns it; an export reads the weights whole and
// leaves the moments to read_moments. Blocks of four sum-of-squares chunks: the shards cut inside
// a block.
TEST(DiskTier, EachRankKeepsTheWholeWeightsAndItsPartOfTheMoments) {
  const ParameterLayout layout(gpt2_config(2, 2, 128, 16, 61));
  std::vector<UpdateSite> sites(layout.spans().size(), UpdateSite::kDisk);
  sites.front() = sites.back() = UpdateSite::kHost;
  const OptimizerShards shards = optimizer_shards(layout, 2);
  bool cut_inside = false;
  for (size_t span = 1; span + 1 < layout.spans().size(); ++span)
    cut_inside = cut_inside || shards.part(layout.spans()[span], 1).first > 0;
  ASSERT_TRUE(cut_inside) << "no block is cut between the ranks";
  const std::unique_ptr<Device> device = make_cpu_device();
  for (const OptimizerStateKind kind :
       {OptimizerStateKind::kFp32, OptimizerStateKind::kBlockwise8Bit})
    for (const int rank : {0, 1}) {
      SCOPED_TRACE(name_of(kind) + ", rank " + std::to_string(rank));
      test_files::TempDir dir;
      DiskTier tier(*device, layout, sites, dir.path(), 1, kind, &shards, rank);
      const std::vector<DiskRecord> records = DiskTier::records(layout, sites, kind, &shards, rank);
      std::mt19937 random(static_cast<uint32_t>(rank + 1));
      std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
      for (size_t r = 0; r < tier.spans().size(); ++r) {
        const size_t span = tier.spans()[r];
        const size_t count = layout.spans()[span].count;
        const OptimizerShards::Part part = shards.part(layout.spans()[span], rank);
        EXPECT_EQ(records[r].moments(), part.count);
        EXPECT_EQ(tier.moment_count(span), part.count);
        EXPECT_EQ(tier.moment_first(span), part.first);
        std::vector<float> params(count), m(count), v(count);
        for (size_t i = 0; i < count; ++i) {
          params[i] = uniform(random);
          m[i] = uniform(random) - 0.5f;
          v[i] = uniform(random);
        }
        tier.write_span(span, {params.data(), m.data(), v.data()});
        // The part as the host's parts code it, from its first element.
        std::vector<float> expected(PackedMoments::padded_bytes(kind, part.count) / 4);
        encode_moments(m.data() + part.first, v.data() + part.first, part.count,
                       AdamWMoments::in_buffer(kind, expected.data(), part.count));
        std::vector<float> packed(expected.size());
        tier.read_moments(span, packed.data());
        // (A rank whose part of the span is empty compares no bytes: memcmp of null is undefined.)
        EXPECT_TRUE(expected.empty() ||
                    std::memcmp(packed.data(), expected.data(), expected.size() * 4) == 0);

        const DiskTier::Lease lease = tier.take(span);
        EXPECT_EQ(std::memcmp(lease.params, params.data(), count * 4), 0);
        std::vector<float> leased(expected.size());
        copy_moments(lease.moments, AdamWMoments::in_buffer(kind, leased.data(), part.count),
                     part.count);
        EXPECT_TRUE(expected.empty() ||
                    std::memcmp(leased.data(), expected.data(), expected.size() * 4) == 0);
        for (size_t i = 0; i < count; ++i) lease.params[i] += 1.0f;
        tier.put_back(lease)();
        std::vector<float> params_back(count);
        tier.read_span(span, {params_back.data(), nullptr, nullptr});
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(params_back[i], params[i] + 1.0f);
        EXPECT_THROW(tier.read_span(span, {nullptr, m.data(), v.data()}), Error);
        // Coded moments in and out, as a checkpoint of the run's kind carries them.
        std::vector<float> whole(PackedMoments::padded_bytes(kind, count) / 4);
        encode_moments(m.data(), v.data(), count,
                       AdamWMoments::in_buffer(kind, whole.data(), count));
        tier.write_span(span, {params.data(), nullptr, nullptr, whole.data()});
        std::fill(packed.begin(), packed.end(), 0.0f);
        tier.read_moments(span, packed.data());
        std::vector<float> from_whole(expected.size());
        copy_moments(AdamWMoments::in_buffer(kind, whole.data(), count).at(part.first),
                     AdamWMoments::in_buffer(kind, from_whole.data(), part.count), part.count);
        EXPECT_TRUE(expected.empty() ||
                    std::memcmp(packed.data(), from_whole.data(), expected.size() * 4) == 0);
      }
      EXPECT_NE(tier.describe().find("this rank's part of their moments"), std::string::npos)
          << tier.describe();
    }
}

}  // namespace
}  // namespace layup
