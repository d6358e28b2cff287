// The LAYUP_* environment variables (environment.h).
#include "cli/environment.h"

#include <filesystem>

#include "core/error.h"
#include "memory/host_memory.h"
#include "train/corpus_shards.h"

#ifdef LAYUP_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/nccl_library.h"
#endif

namespace layup {

namespace fs = std::filesystem;

LayupEnvironment read_layup_environment(const EnvironmentLookup& lookup) {
  const auto text = [&](const char* name) {
    const char* value = lookup(name);
    return std::string(value != nullptr ? value : "");
  };
  LayupEnvironment environment;
  if (const std::string isa = text("LAYUP_ADAMW_ISA"); !isa.empty() && isa != "auto")
    environment.adamw_isa = parse_adamw_isa(isa, "LAYUP_ADAMW_ISA");
  const std::string stream = text("LAYUP_ADAMW_STREAM");
  LAYUP_CHECK(stream.empty() || stream == "0" || stream == "1", "LAYUP_ADAMW_STREAM '", stream,
              "' is neither 0 nor 1: give 0 to turn the CPU AdamW's streaming stores off, 1 (or "
              "leave it unset) to allow them");
  environment.adamw_streaming_stores = stream != "0";
  environment.nccl_library = text("LAYUP_NCCL_LIBRARY");
  environment.system_root = text("LAYUP_SYSTEM_ROOT");
  std::error_code error;
  LAYUP_CHECK(environment.system_root.empty() || fs::is_directory(environment.system_root, error),
              "LAYUP_SYSTEM_ROOT '", environment.system_root,
              "' is not a folder: give a folder holding proc/ and sys/ as the machine's root, or "
              "unset it to read the real one");
  environment.data_dir = text("LAYUP_DATA_DIR");
  const std::string share = text("LAYUP_RANKS_SHARE_GPUS");
  LAYUP_CHECK(share.empty() || share == "0" || share == "1", "LAYUP_RANKS_SHARE_GPUS '", share,
              "' is neither 0 nor 1: give 1 to let more ranks than a host has GPUs share them, 0 "
              "(or leave it unset) for a GPU a rank");
  environment.ranks_share_gpus = share == "1";
  return environment;
}

void apply_layup_environment(const LayupEnvironment& environment) {
  set_adamw_defaults({environment.adamw_isa, environment.adamw_streaming_stores});
  set_system_root(environment.system_root);
  // The running binary's own path, whatever the current folder or the name it was started by.
  std::error_code error;
  const fs::path executable = fs::read_symlink("/proc/self/exe", error);
  set_shipped_data_places(shipped_data_places(
      environment.data_dir, error ? std::string() : executable.string(), LAYUP_DATA_DIR));
#ifdef LAYUP_HAVE_CUDA
  nccl::set_chosen_nccl_library(environment.nccl_library);
  set_ranks_share_cuda_devices(environment.ranks_share_gpus);
#endif
}

std::vector<std::string> shipped_data_places(const std::string& data_dir,
                                             const std::string& executable,
                                             const std::string& source_data) {
  if (!data_dir.empty()) return {data_dir};
  std::vector<std::string> places;
  if (!executable.empty())
    places.push_back(
        (fs::path(executable).parent_path().parent_path() / "share" / "layup").string());
  places.push_back(source_data);
  return places;
}

}  // namespace layup
