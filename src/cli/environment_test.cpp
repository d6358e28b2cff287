// The LAYUP_* environment variables: each read into its typed value, a bad one refused naming the
// variable and what it takes, and the values handed to the libraries that use them.
#include "cli/environment.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "memory/host_memory.h"
#include "train/corpus_shards.h"

namespace layup {
namespace {

LayupEnvironment read_from(const std::map<std::string, std::string>& variables) {
  return read_layup_environment([&](const char* name) -> const char* {
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  });
}

std::string error_of(const std::map<std::string, std::string>& variables) {
  try {
    read_from(variables);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Environment, UnsetVariablesLeaveTheDefaults) {
  const LayupEnvironment environment = read_from({});
  EXPECT_FALSE(environment.adamw_isa);
  EXPECT_TRUE(environment.adamw_streaming_stores);
  EXPECT_EQ(environment.nccl_library, "");
  EXPECT_EQ(environment.system_root, "");
  EXPECT_EQ(environment.data_dir, "");
  EXPECT_FALSE(environment.ranks_share_gpus);
}

TEST(Environment, ReadsEachVariableIntoItsTypedValue) {
  const std::string root = ::testing::TempDir();
  const LayupEnvironment environment = read_from({{"LAYUP_ADAMW_ISA", "scalar"},
                                                  {"LAYUP_ADAMW_STREAM", "0"},
                                                  {"LAYUP_NCCL_LIBRARY", "/opt/libnccl.so.2"},
                                                  {"LAYUP_SYSTEM_ROOT", root},
                                                  {"LAYUP_DATA_DIR", "/somewhere/data"},
                                                  {"LAYUP_RANKS_SHARE_GPUS", "1"}});
  EXPECT_EQ(environment.adamw_isa, AdamWIsa::kScalar);
  EXPECT_FALSE(environment.adamw_streaming_stores);
  EXPECT_EQ(environment.nccl_library, "/opt/libnccl.so.2");
  EXPECT_EQ(environment.system_root, root);
  EXPECT_EQ(environment.data_dir, "/somewhere/data");
  EXPECT_TRUE(environment.ranks_share_gpus);
  EXPECT_FALSE(read_from({{"LAYUP_RANKS_SHARE_GPUS", "0"}}).ranks_share_gpus);
  EXPECT_FALSE(read_from({{"LAYUP_ADAMW_ISA", "auto"}}).adamw_isa);
  EXPECT_TRUE(read_from({{"LAYUP_ADAMW_STREAM", "1"}}).adamw_streaming_stores);
}

TEST(Environment, EveryAvailableAdamWLevelIsTaken) {
  for (AdamWIsa isa : available_adamw_isas()) {
    std::string name = adamw_isa_name(isa);
    std::erase(name, '-');  // "AVX-512" -> "AVX512"; names are read in any case
    EXPECT_EQ(read_from({{"LAYUP_ADAMW_ISA", name}}).adamw_isa, isa) << name;
  }
}

TEST(Environment, AnUnknownAdamWLevelIsRefusedNamingTheVariableAndTheLevels) {
  const std::string message = error_of({{"LAYUP_ADAMW_ISA", "sse9"}});
  EXPECT_NE(message.find("LAYUP_ADAMW_ISA 'sse9'"), std::string::npos) << message;
  EXPECT_NE(message.find("scalar, avx2, avx512, neon or auto"), std::string::npos) << message;
}

TEST(Environment, AStreamSettingOtherThanZeroOrOneIsRefused) {
  for (const char* value : {"2", "yes", "off", " 0"}) {
    const std::string message = error_of({{"LAYUP_ADAMW_STREAM", value}});
    EXPECT_NE(message.find(std::string("LAYUP_ADAMW_STREAM '") + value + "'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("neither 0 nor 1"), std::string::npos) << message;
  }
}

TEST(Environment, ASharingSettingOtherThanZeroOrOneIsRefused) {
  const std::string message = error_of({{"LAYUP_RANKS_SHARE_GPUS", "yes"}});
  EXPECT_NE(message.find("LAYUP_RANKS_SHARE_GPUS 'yes' is neither 0 nor 1"), std::string::npos)
      << message;
}

TEST(Environment, ASystemRootThatIsNotAFolderIsRefused) {
  const std::string message = error_of({{"LAYUP_SYSTEM_ROOT", "/nonexistent/root"}});
  EXPECT_NE(message.find("LAYUP_SYSTEM_ROOT '/nonexistent/root' is not a folder"),
            std::string::npos)
      << message;
}

TEST(Environment, AppliedValuesReachTheLibraries) {
  const std::string data = ::testing::TempDir();
  LayupEnvironment environment;
  environment.adamw_isa = AdamWIsa::kScalar;
  environment.adamw_streaming_stores = false;
  environment.data_dir = data;
  apply_layup_environment(environment);
  EXPECT_EQ(default_adamw_isa(), AdamWIsa::kScalar);
  EXPECT_FALSE(adamw_streaming_stores_allowed());
  EXPECT_EQ(shipped_data_dir(), data);
  apply_layup_environment({});  // the plain defaults back for the other tests
  EXPECT_EQ(default_adamw_isa(), best_adamw_isa());
  EXPECT_TRUE(adamw_streaming_stores_allowed());
  // This test binary lies in the build folder: no share/layup beside it, the source tree's data/.
  EXPECT_EQ(shipped_data_dir(), LAYUP_DATA_DIR);
}

TEST(Environment, ShippedDataIsLookedForBesideTheBinaryThenInTheSourceTree) {
  EXPECT_EQ(shipped_data_places("", "/opt/layup/bin/layup", "/src/layup/data"),
            (std::vector<std::string>{"/opt/layup/share/layup", "/src/layup/data"}));
  EXPECT_EQ(shipped_data_places("", "", "/src/layup/data"),
            std::vector<std::string>{"/src/layup/data"});
  // LAYUP_DATA_DIR overrides both.
  EXPECT_EQ(shipped_data_places("/mine", "/opt/layup/bin/layup", "/src/layup/data"),
            std::vector<std::string>{"/mine"});
}

TEST(Environment, TheFirstPlaceThatExistsHoldsTheShippedData) {
  const std::filesystem::path root = std::filesystem::path(::testing::TempDir()) / "data_places";
  std::filesystem::create_directories(root / "second");
  std::filesystem::create_directories(root / "third");
  const std::string missing = (root / "first").string(), second = (root / "second").string();
  set_shipped_data_places({missing, second, (root / "third").string()});
  EXPECT_EQ(shipped_data_dir(), second);

  // None there: the error names every place looked in, and what to do.
  set_shipped_data_places({missing, (root / "fourth").string()});
  std::string message;
  try {
    shipped_data_dir();
  } catch (const Error& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("none of: " + missing + ", " + (root / "fourth").string() + ";"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("LAYUP_DATA_DIR"), std::string::npos) << message;
  EXPECT_NE(message.find("cmake --install"), std::string::npos) << message;
  apply_layup_environment({});
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace layup
