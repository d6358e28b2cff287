// The ranks' agreement: the first differing setting, its message, and the collective run by
// threads standing in for ranks, whose every broadcast must have one size on all of them.
#include "comm/rank_agreement.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <stdexcept>
#include <thread>

#include "core/error.h"

namespace layup {
namespace {

const std::vector<SharedSetting> kLeaders = {
    {"layup", "0.1.0 (commit abc)"}, {"--layers", "2"}, {"--steps", "4"}, {"--seed", "1337"}};

TEST(RankAgreement, TheSameSettingsAgree) {
  EXPECT_EQ(first_difference(kLeaders, kLeaders), std::nullopt);
  EXPECT_EQ(first_difference({}, {}), std::nullopt);
}

TEST(RankAgreement, TheFirstDifferingSettingIsFound) {
  std::vector<SharedSetting> mine = kLeaders;
  mine[3].value = std::string("7");  // not = "7": GCC 12 warns falsely (-Wrestrict)
  mine[2].value = std::string("2");
  EXPECT_EQ(first_difference(kLeaders, mine), 2u);
  // Another name at the same place (another build's list) differs too.
  mine = kLeaders;
  mine[1].name = "--heads";
  EXPECT_EQ(first_difference(kLeaders, mine), 1u);
}

TEST(RankAgreement, ALongerListDiffersWhereTheShorterEnds) {
  const std::vector<SharedSetting> shorter(kLeaders.begin(), kLeaders.end() - 1);
  EXPECT_EQ(first_difference(kLeaders, shorter), 3u);
  EXPECT_EQ(first_difference(shorter, kLeaders), 3u);
}

TEST(RankAgreement, TheMessageNamesTheRankTheFlagAndBothValues) {
  EXPECT_EQ(disagreement_message(1, {"--steps", "2"}, {"--steps", "4"}),
            "rank 1 was given --steps 2 but rank 0 --steps 4: every rank of an mpirun must get "
            "the same flags");
  EXPECT_EQ(disagreement_message(3, {"--resume", ""}, {"--resume", "step-00000004"}),
            "rank 3 was given no --resume but rank 0 --resume step-00000004: every rank of an "
            "mpirun must get the same flags");
  EXPECT_EQ(disagreement_message(1, {"layup", "0.1.0 (commit b)"}, {"layup", "0.1.0 (commit a)"}),
            "rank 1 has layup 0.1.0 (commit b) but rank 0 layup 0.1.0 (commit a): every rank of "
            "an mpirun must run the same layup build on the same files");
  // One line whatever the value holds.
  EXPECT_EQ(disagreement_message(1, {"--prompt", "a\nb"}, {"--prompt", "\n"}).find('\n'),
            std::string::npos);
}

// Ranks as threads of one process: a broadcast copies the root's bytes into every other rank's
// and throws where a rank's buffer has another size (a mismatched MPI_Bcast), a gather collects
// one double a rank. Two barriers a collective keep the ranks in step.
class ThreadRanks {
 public:
  explicit ThreadRanks(int size) : size_(size), sync_(size), values_(size) {}

  class Rank final : public Communicator {
   public:
    Rank(ThreadRanks& ranks, int rank) : ranks_(ranks), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return ranks_.size_; }
    int local_rank() const override { return rank_; }
    void broadcast(std::vector<uint8_t>& bytes, int root) override {
      if (rank_ == root) ranks_.bytes_ = bytes;
      ranks_.sync_.arrive_and_wait();
      const bool same_size = ranks_.bytes_.size() == bytes.size();
      if (same_size && rank_ != root) bytes = ranks_.bytes_;
      ranks_.sync_.arrive_and_wait();
      if (!same_size) ++ranks_.mismatched_;
    }
    std::vector<double> gather(double value) override {
      ranks_.values_[rank_] = value;
      ranks_.sync_.arrive_and_wait();
      std::vector<double> values = ranks_.values_;
      ranks_.sync_.arrive_and_wait();
      return values;
    }
    void sum_in_rank_order(float*, size_t) override { unused(); }
    void reduce_scatter_in_rank_order(float*, std::span<const size_t>) override { unused(); }
    void all_gather(float*, std::span<const size_t>) override { unused(); }
    void all_gather(double*, std::span<const size_t>) override { unused(); }
    void send(const uint64_t*, size_t, int) override { unused(); }
    void receive(uint64_t*, size_t, int) override { unused(); }
    void send(const float*, size_t, int) override { unused(); }
    void receive(float*, size_t, int) override { unused(); }

   private:
    [[noreturn]] static void unused() { throw std::logic_error("not a collective of agreement"); }
    ThreadRanks& ranks_;
    int rank_;
  };

  // Each rank checks its own settings; what each threw ("" where it returned).
  std::vector<std::string> agree(const std::vector<std::vector<SharedSetting>>& settings) {
    std::vector<std::string> errors(size_);
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r)
      threads.emplace_back([&, r] {
        Rank rank(*this, r);
        try {
          check_ranks_agree(rank, settings[r]);
        } catch (const Error& error) {
          errors[r] = error.what();
        }
      });
    for (std::thread& thread : threads) thread.join();
    return errors;
  }
  int mismatched() const { return mismatched_; }

 private:
  int size_;
  std::barrier<> sync_;
  std::vector<uint8_t> bytes_;
  std::vector<double> values_;
  std::atomic<int> mismatched_{0};
};

TEST(RankAgreement, RanksWithTheSameSettingsAllGoOn) {
  ThreadRanks ranks(3);
  EXPECT_EQ(ranks.agree({kLeaders, kLeaders, kLeaders}), std::vector<std::string>(3));
  EXPECT_EQ(ranks.mismatched(), 0);
}

TEST(RankAgreement, EveryRankRefusesNamingTheLowestDifferingRank) {
  std::vector<SharedSetting> steps = kLeaders, seed = kLeaders;
  steps[2].value = std::string("2");
  seed[3].value = std::string("7");  // not = "7": GCC 12 warns falsely (-Wrestrict)
  ThreadRanks ranks(3);
  const std::vector<std::string> errors = ranks.agree({kLeaders, seed, steps});
  for (const std::string& error : errors)
    EXPECT_EQ(error,
              "rank 1 was given --seed 7 but rank 0 --seed 1337: every rank of an mpirun "
              "must get the same flags");
  EXPECT_EQ(ranks.mismatched(), 0);
}

TEST(RankAgreement, SettingsOfOtherLengthsAreRefusedWithoutAMismatchedCollective) {
  std::vector<SharedSetting> longer = kLeaders;
  longer.push_back({"--until-step", "3"});
  ThreadRanks ranks(2);
  for (const std::string& error : ranks.agree({kLeaders, longer}))
    EXPECT_EQ(error,
              "rank 1 was given --until-step 3 but rank 0 no --until-step: every rank of "
              "an mpirun must get the same flags");
  EXPECT_EQ(ranks.mismatched(), 0);
}

TEST(RankAgreement, OneProcessAgreesWithItself) {
  check_ranks_agree(*make_single_process_communicator(), kLeaders);
}

}  // namespace
}  // namespace layup
