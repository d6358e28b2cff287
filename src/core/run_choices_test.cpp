// The run's choices: each name parses to its value and back, and a wrong name is refused listing
// the right ones.
#include "core/run_choices.h"

#include <gtest/gtest.h>

#include "backend/algorithm_choice.h"

namespace layup {
namespace {

template <class Enum, size_t N>
void expect_round_trip(const EnumNames<Enum, N>& names) {
  for (const auto& [value, name] : names) {
    EXPECT_EQ(parse_in(names, std::string(name), "--flag"), value) << name;
    EXPECT_EQ(name_in(names, value), name);
  }
}

TEST(RunChoices, EveryNameParsesToItsValueAndBack) {
  expect_round_trip(kModeNames);
  expect_round_trip(kDeviceNames);
  expect_round_trip(kDtypeNames);
  expect_round_trip(kLayupClipNames);
  expect_round_trip(kLayupHeadNames);
  expect_round_trip(kAlgorithmChoiceNames);
  expect_round_trip(kOptimizerStateKindNames);
  EXPECT_EQ(name_of(Mode::kLayup), "layup");
  EXPECT_EQ(name_of(AlgorithmChoice::kTimed), "timed");
  EXPECT_EQ(name_of(OptimizerStateKind::kBlockwise8Bit), "8bit");
}

TEST(RunChoices, AWrongNameIsRefusedListingTheNames) {
  try {
    parse_in(kModeNames, "zero3", "--mode");
    FAIL() << "zero3 parsed as a mode";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "--mode takes one of gpu, offload, layup (got 'zero3')");
  }
  EXPECT_THROW(parse_in(kAlgorithmChoiceNames, "Timed", "--algorithms"), Error);  // names are exact
}

}  // namespace
}  // namespace layup
