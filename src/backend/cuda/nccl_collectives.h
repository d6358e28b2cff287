// The CUDA device's collectives across ranks (backend/device.h's DeviceCollectives) over NCCL,
// one rank per GPU, the ranks started by MPI (docs/parallel.md). The rank-order sum is exchanged
// with NCCL's point-to-point calls and added by a kernel of layup's, so that no reduction order
// is NCCL's: two GPUs give the bits one GPU gives with both micro-batches.
//
// Plain C++ header: callers need no CUDA or NCCL headers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/device.h"

namespace layup {

// A new NCCL unique id (ncclGetUniqueId), as bytes for MPI to hand to every rank.
std::vector<uint8_t> new_nccl_id();

// This rank's NCCL communicator among `ranks` (ncclCommInitRank with rank 0's id) on the current
// GPU, its receive buffer allocated from `device`. Both load NCCL on first use (nccl_library.h)
// and throw layup::Error where it cannot be loaded, naming what to install.
std::unique_ptr<DeviceCollectives> make_nccl_collectives(Device& device,
                                                         const std::vector<uint8_t>& id, int rank,
                                                         int ranks);

}  // namespace layup
