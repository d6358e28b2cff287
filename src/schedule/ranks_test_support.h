// For the suites that run as several ranks under mpirun (RanksEquivalence, RanksTrace): they share
// one MPI, which a process may finalise only once and never start again, so no test finalises it;
// this environment does, after every test of the process (inline: registered once, whichever test
// files include it). Nothing where MPI never started.
#pragma once

#include <gtest/gtest.h>

#include "comm/communicator.h"

namespace layup {

class FinishRanksAfterTheTests final : public ::testing::Environment {
 public:
  void TearDown() override { finish_ranks(); }
};

inline ::testing::Environment* const kFinishRanksAfterTheTests =
    ::testing::AddGlobalTestEnvironment(new FinishRanksAfterTheTests);

}  // namespace layup
