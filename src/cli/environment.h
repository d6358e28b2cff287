// The LAYUP_* environment variables, read in this one place when `layup` starts, checked, and
// handed to the libraries as typed values (none of them reads the environment). docs/running.md
// lists them. LAYUP_ATTENTION is --attention's (CLI11 reads it with the flag); the rank variables
// mpirun sets are the communicator's. The shipped data is looked for beside the binary too, so that
// an installed `layup` finds it wherever it lies.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "optim/adamw_simd.h"

namespace layup {

struct LayupEnvironment {
  std::optional<AdamWIsa> adamw_isa;   // LAYUP_ADAMW_ISA; none (unset, "" or auto): the best level
  bool adamw_streaming_stores = true;  // LAYUP_ADAMW_STREAM: 1 (the default) or 0
  std::string nccl_library;            // LAYUP_NCCL_LIBRARY; empty: the loader's search
  std::string system_root;             // LAYUP_SYSTEM_ROOT; empty: "/"
  std::string data_dir;                // LAYUP_DATA_DIR; empty: shipped_data_places' search
  bool ranks_share_gpus = false;       // LAYUP_RANKS_SHARE_GPUS: 0 (the default) or 1
};

// A variable's value, or null when unset (std::getenv; tests give a table).
using EnvironmentLookup = std::function<const char*(const char* name)>;

// Reads and checks every variable: throws layup::Error naming the variable, its value and the
// values it takes (an unknown or unavailable LAYUP_ADAMW_ISA, a LAYUP_ADAMW_STREAM other than 0
// or 1, a LAYUP_SYSTEM_ROOT that is not a folder).
LayupEnvironment read_layup_environment(const EnvironmentLookup& lookup);

// Hands the values to the libraries that use them; before any command runs.
void apply_layup_environment(const LayupEnvironment& environment);

// The folders the shipped data (the GPT-2 tokenizer, the corpus) is looked for in, in order:
// `data_dir` (LAYUP_DATA_DIR) alone where it is set; else PREFIX/share/layup for the binary
// `executable` in PREFIX/bin (where `cmake --install` puts both), then `source_data`, the data/ of
// the source tree the binary was built from (a binary in its build folder). An empty `executable`
// (unknown) leaves its place out.
std::vector<std::string> shipped_data_places(const std::string& data_dir,
                                             const std::string& executable,
                                             const std::string& source_data);

}  // namespace layup
