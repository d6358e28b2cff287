// NCCL's loader: a library that is missing, or is not NCCL, is one clear error; the real one,
// where this machine has it (the CUDA toolkit's), loads and reports its version.
#include "backend/cuda/nccl_library.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace layup::nccl {
namespace {

std::string error_of(const std::vector<std::string>& candidates) {
  try {
    Library library(candidates);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(NcclLibrary, AMissingLibraryIsRefusedSayingWhatToInstall) {
  const std::string message = error_of({"/nonexistent/libnccl.so.2"});
  EXPECT_NE(message.find("/nonexistent/libnccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("nvidia-nccl-cu13"), std::string::npos) << message;
  EXPECT_NE(message.find("LAYUP_NCCL_LIBRARY"), std::string::npos) << message;
}

TEST(NcclLibrary, ALibraryThatIsNotNcclIsRefused) {
  const std::string message = error_of({"libm.so.6"});
  EXPECT_NE(message.find("libm.so.6 has no ncclGetUniqueId"), std::string::npos) << message;
}

TEST(NcclLibrary, TheChosenLibraryIsTheOnlyCandidate) {
  set_chosen_nccl_library("/opt/mine/libnccl.so.2");
  const std::vector<std::string> chosen = nccl_library_candidates();
  set_chosen_nccl_library("");
  EXPECT_EQ(chosen, std::vector<std::string>{"/opt/mine/libnccl.so.2"});
  EXPECT_EQ(nccl_library_candidates().front(), "libnccl.so.2");
}

TEST(NcclLibrary, TheInstalledLibraryLoadsAndSaysItsVersion) {
  const std::vector<std::string> candidates = nccl_library_candidates();
  bool present = false;
  for (const std::string& path : candidates)
    if (void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
      dlclose(handle);
      present = true;
    }
  if (!present) GTEST_SKIP() << "no NCCL on this machine";
  const Library library(candidates);
  EXPECT_EQ(library.describe().rfind("NCCL 2.", 0), 0u) << library.describe();
}

}  // namespace
}  // namespace layup::nccl
