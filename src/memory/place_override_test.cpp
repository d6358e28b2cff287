// --place CLASS=KIND as a typed value: every class and kind writes a name that parses back to it,
// aliases read as the class they name and are written in the CLI names, and malformed text is
// refused saying what --place takes.
#include "memory/place_override.h"

#include <gtest/gtest.h>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::error_message;

TEST(PlaceOverride, EveryClassAndKindRoundTripsThroughItsName) {
  int pairs = 0;
  for (TensorClass tensor_class : kAllTensorClasses)
    for (MemoryKind kind : kAllMemoryKinds) {
      const PlaceOverride place{tensor_class, kind};
      EXPECT_EQ(PlaceOverride::parse(place.name()), place) << place.name();
      ++pairs;
    }
  EXPECT_EQ(pairs, kTensorClassCount * kMemoryKindCount);
  EXPECT_EQ((PlaceOverride{TensorClass::kWeightGrads, MemoryKind::kPinnedMapped}).name(),
            "grads=pinned");
}

TEST(PlaceOverride, AliasesReadAsTheirClassAndAreWrittenInTheCliNames) {
  const std::vector<PlaceOverride> places =
      parse_place_overrides({"master-weights=mapped", "Gradients=PINNED", "adam=host"});
  EXPECT_EQ(places,
            (std::vector<PlaceOverride>{{TensorClass::kMasterWeights, MemoryKind::kPinnedMapped},
                                        {TensorClass::kWeightGrads, MemoryKind::kPinnedMapped},
                                        {TensorClass::kOptimizerMoments, MemoryKind::kHost}}));
  EXPECT_EQ(place_override_names(places),
            (std::vector<std::string>{"master=pinned", "grads=pinned", "moments=host"}));
}

TEST(PlaceOverride, MalformedTextIsRefusedSayingWhatPlaceTakes) {
  for (const char* text : {"grads", "", "=pinned", "grads=", "grads:pinned"})
    EXPECT_EQ(
        error_message([&] { PlaceOverride::parse(text); }),
        std::string("--place takes CLASS=KIND, e.g. --place grads=pinned (got '") + text + "')");
  EXPECT_EQ(error_message([] { PlaceOverride::parse("grads=vram"); }),
            "--place grads=vram: 'vram' is not a memory kind; use device, pinned, managed, "
            "pageable or host");
  const std::string unknown_class = error_message([] { PlaceOverride::parse("biases=host"); });
  EXPECT_EQ(unknown_class.rfind("--place biases=host: 'biases' ", 0), 0u) << unknown_class;
  // One bad text among good ones refuses the list.
  EXPECT_EQ(error_message([] {
              parse_place_overrides({"grads=host", "moments=vram"});
            }).rfind("--place moments=vram: ", 0),
            0u);
}

}  // namespace
}  // namespace layup
