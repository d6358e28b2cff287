// NCCL, opened with dlopen by the first run of several ranks on GPUs, so that no other run maps
// its 200+ MB library (a process under a small address-space limit could not start). Only the
// entry points layup calls are declared, with the signatures and values of NCCL's documented C API
// (nccl.h is not needed to build). Plain C++: built in every build; the CUDA device uses it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace layup::nccl {

using Result = int;  // ncclResult_t: ncclSuccess is 0
constexpr Result kSuccess = 0;
struct CommOpaque;
using Comm = CommOpaque*;  // ncclComm_t
struct UniqueId {          // ncclUniqueId
  char internal[128];      // NCCL_UNIQUE_ID_BYTES
};
constexpr int kFloat32 = 7;  // ncclDataType_t ncclFloat32
using Stream = CUstream_st*;

// The library and its entry points, loaded once per process on first use. Throws layup::Error
// naming what was tried and what to install when it cannot be loaded.
class Library {
 public:
  // The process's library, from nccl_library_candidates(), loaded on the first call.
  static const Library& get();
  // The first of `candidates` that loads (tests name their own).
  explicit Library(const std::vector<std::string>& candidates);

  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // Throws layup::Error ("<call> failed: <NCCL's reason>") unless status is kSuccess.
  void check(Result status, const char* call) const;
  // "NCCL 2.27.7 (/usr/local/cuda/lib/libnccl.so.2)".
  const std::string& describe() const { return describe_; }

  Result (*get_unique_id)(UniqueId*) = nullptr;
  Result (*comm_init_rank)(Comm*, int, UniqueId, int) = nullptr;
  Result (*comm_destroy)(Comm) = nullptr;
  Result (*send)(const void*, size_t, int, int, Comm, Stream) = nullptr;
  Result (*recv)(void*, size_t, int, int, Comm, Stream) = nullptr;
  Result (*group_start)() = nullptr;
  Result (*group_end)() = nullptr;
  const char* (*error_string)(Result) = nullptr;
  Result (*get_version)(int*) = nullptr;

 private:
  void* library_ = nullptr;
  std::string describe_;
};

// The library Library loads from now on, alone (a path, or a name for the dynamic loader); empty:
// the search below. Given once at start-up (the CLI takes it from LAYUP_NCCL_LIBRARY,
// cli/environment.h).
void set_chosen_nccl_library(const std::string& library);

// Where Library looks, in order: the chosen library alone when there is one, else "libnccl.so.2"
// through the loader's search path, then the library CMake found at configure time (the toolkit's,
// or pip's nvidia-nccl-cu*), where there was one.
std::vector<std::string> nccl_library_candidates();

}  // namespace layup::nccl
