// NCCL through dlopen; see nccl_library.h.
#include "backend/cuda/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include "core/error.h"

namespace layup::nccl {

namespace {

template <class Function>
void load(void* library, Function& function, const char* symbol, const std::string& path) {
  function = reinterpret_cast<Function>(dlsym(library, symbol));
  LAYUP_CHECK(function != nullptr, path, " has no ", symbol, ": not an NCCL 2.7 or later");
}

// Set at start-up (set_chosen_nccl_library), then only read.
std::string& chosen_library() {
  static std::string library;
  return library;
}

}  // namespace

void set_chosen_nccl_library(const std::string& library) {
  chosen_library() = library;
}

std::vector<std::string> nccl_library_candidates() {
  if (!chosen_library().empty()) return {chosen_library()};
  std::vector<std::string> paths{"libnccl.so.2"};
#ifdef LAYUP_NCCL_CONFIGURED_PATH
  paths.emplace_back(LAYUP_NCCL_CONFIGURED_PATH);
#endif
  return paths;
}

Library::Library(const std::vector<std::string>& candidates) {
  std::string why;
  std::string path;
  for (const std::string& candidate : candidates) {
    library_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_ != nullptr) {
      path = candidate;
      break;
    }
    const char* error = dlerror();
    why += (why.empty() ? "" : "; ") + std::string(error != nullptr ? error : candidate);
  }
  LAYUP_CHECK(library_ != nullptr, "several ranks on GPUs need NCCL, which could not be loaded (",
              why,
              "): install it (the CUDA toolkit's libnccl, or pip install nvidia-nccl-cu13) or "
              "name it with LAYUP_NCCL_LIBRARY=/path/to/libnccl.so.2; or run one rank");
  load(library_, get_unique_id, "ncclGetUniqueId", path);
  load(library_, comm_init_rank, "ncclCommInitRank", path);
  load(library_, comm_destroy, "ncclCommDestroy", path);
  load(library_, send, "ncclSend", path);
  load(library_, recv, "ncclRecv", path);
  load(library_, group_start, "ncclGroupStart", path);
  load(library_, group_end, "ncclGroupEnd", path);
  load(library_, error_string, "ncclGetErrorString", path);
  load(library_, get_version, "ncclGetVersion", path);
  int version = 0;
  check(get_version(&version), "ncclGetVersion");
  // NCCL 2.9 on: major * 10000 + minor * 100 + patch.
  describe_ = "NCCL " + std::to_string(version / 10000) + "." +
              std::to_string(version / 100 % 100) + "." + std::to_string(version % 100) + " (" +
              path + ")";
}

const Library& Library::get() {
  // Never closed: NCCL's own threads may outlive any object of layup's.
  static const Library* library = new Library(nccl_library_candidates());
  return *library;
}

void Library::check(Result status, const char* call) const {
  if (status == kSuccess) return;
  const char* reason = error_string != nullptr ? error_string(status) : nullptr;
  fail(call, " failed: ", reason != nullptr ? reason : "NCCL error " + std::to_string(status),
       " (NCCL_DEBUG=INFO in the environment says more)");
}

}  // namespace layup::nccl
