// The LAYUP_* environment variables: each read into its typed value, a bad one refused naming the
// variable and what it takes, and the values handed to the libraries that use them.
#include "cli/environment.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

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
}

TEST(Environment, ReadsEachVariableIntoItsTypedValue) {
  const std::string root = ::testing::TempDir();
  const LayupEnvironment environment = read_from({{"LAYUP_ADAMW_ISA", "scalar"},
                                                  {"LAYUP_ADAMW_STREAM", "0"},
                                                  {"LAYUP_NCCL_LIBRARY", "/opt/libnccl.so.2"},
                                                  {"LAYUP_SYSTEM_ROOT", root},
                                                  {"LAYUP_DATA_DIR", "/somewhere/data"}});
  EXPECT_EQ(environment.adamw_isa, AdamWIsa::kScalar);
  EXPECT_FALSE(environment.adamw_streaming_stores);
  EXPECT_EQ(environment.nccl_library, "/opt/libnccl.so.2");
  EXPECT_EQ(environment.system_root, root);
  EXPECT_EQ(environment.data_dir, "/somewhere/data");
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

TEST(Environment, ASystemRootThatIsNotAFolderIsRefused) {
  const std::string message = error_of({{"LAYUP_SYSTEM_ROOT", "/nonexistent/root"}});
  EXPECT_NE(message.find("LAYUP_SYSTEM_ROOT '/nonexistent/root' is not a folder"),
            std::string::npos)
      << message;
}

TEST(Environment, AppliedValuesReachTheLibraries) {
  LayupEnvironment environment;
  environment.adamw_isa = AdamWIsa::kScalar;
  environment.adamw_streaming_stores = false;
  environment.data_dir = "/somewhere/data";
  apply_layup_environment(environment);
  EXPECT_EQ(default_adamw_isa(), AdamWIsa::kScalar);
  EXPECT_FALSE(adamw_streaming_stores_allowed());
  EXPECT_EQ(shipped_data_dir(), "/somewhere/data");
  apply_layup_environment({});  // the plain defaults back for the other tests
  EXPECT_EQ(default_adamw_isa(), best_adamw_isa());
  EXPECT_TRUE(adamw_streaming_stores_allowed());
  EXPECT_NE(shipped_data_dir(), "/somewhere/data");
}

}  // namespace
}  // namespace layup
