// NcclCollectives: sum_in_rank_order as Communicator's MPI version does it, in device memory.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nccl_collectives.h"
#include "core/error.h"

#if LAYUP_HAVE_NCCL
#include <nccl.h>
#endif

namespace layup {

#if LAYUP_HAVE_NCCL

namespace {

void check_nccl(ncclResult_t status, const char* call) {
  if (status != ncclSuccess)
    fail(call, " failed: ", ncclGetErrorString(status),
         " (NCCL_DEBUG=INFO in the environment says more)");
}

// out[i] = +0 + received[0 * stride + i] + received[1 * stride + i] + ...: the ranks' copies of
// this rank's piece, added in rank order, as the host's sum does.
__global__ void add_in_rank_order(float* out, const float* received, int ranks, size_t stride,
                                  size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < ranks; ++r) sum += received[r * stride + i];
    out[i] = sum;
  }
}

class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(Device& device, const std::vector<uint8_t>& id, int rank, int ranks)
      : rank_(rank), ranks_(ranks) {
    ncclUniqueId unique{};
    LAYUP_CHECK(id.size() == sizeof unique, "internal error: an NCCL id of ", id.size(),
                " bytes, not ", sizeof unique);
    std::memcpy(&unique, id.data(), sizeof unique);
    check_nccl(ncclCommInitRank(&comm_, ranks, unique, rank), "ncclCommInitRank");
    // A round's pieces from every rank: kNcclRoundFloats in all, whatever the model.
    received_ = device.allocate(cuda_collectives_buffers().at(0));
  }
  ~NcclCollectives() override { ncclCommDestroy(comm_); }

  void sum_in_rank_order(float* data, size_t count) override {
    // On the legacy default stream, where the device's other work runs: ordered with it both ways.
    const cudaStream_t stream = cudaStreamLegacy;
    const size_t stride = kNcclRoundFloats / ranks_;
    for (size_t first = 0; first < count; first += stride * ranks_) {
      const size_t n = std::min(stride * ranks_, count - first);
      // Piece r of the round: [n r / N, n (r + 1) / N), at most `stride` floats.
      const auto begin = [&](int r) { return first + n * r / ranks_; };
      const auto length = [&](int r) { return begin(r + 1) - begin(r); };
      const size_t mine = length(rank_);
      // Every rank's copy of my piece, rank r's at received_[r * stride].
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < ranks_; ++r) {
        check_nccl(ncclSend(data + begin(r), length(r), ncclFloat, r, comm_, stream), "ncclSend");
        check_nccl(ncclRecv(received_.data() + r * stride, mine, ncclFloat, r, comm_, stream),
                   "ncclRecv");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
      if (mine > 0) {
        const int threads = 256;
        const int blocks = static_cast<int>(std::min<size_t>((mine + threads - 1) / threads, 4096));
        add_in_rank_order<<<blocks, threads, 0, stream>>>(data + begin(rank_), received_.data(),
                                                          ranks_, stride, mine);
        LAYUP_CUDA_CHECK_LAUNCH();
      }
      // The sums back to every rank.
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < ranks_; ++r) {
        if (r == rank_) continue;
        check_nccl(ncclSend(data + begin(rank_), mine, ncclFloat, r, comm_, stream), "ncclSend");
        check_nccl(ncclRecv(data + begin(r), length(r), ncclFloat, r, comm_, stream), "ncclRecv");
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    }
  }

 private:
  int rank_ = 0, ranks_ = 1;
  ncclComm_t comm_ = nullptr;
  DeviceBuffer received_;
};

}  // namespace

std::vector<uint8_t> new_nccl_id() {
  ncclUniqueId unique{};
  check_nccl(ncclGetUniqueId(&unique), "ncclGetUniqueId");
  std::vector<uint8_t> id(sizeof unique);
  std::memcpy(id.data(), &unique, sizeof unique);
  return id;
}

std::unique_ptr<DeviceCollectives> make_nccl_collectives(Device& device,
                                                         const std::vector<uint8_t>& id, int rank,
                                                         int ranks) {
  return std::make_unique<NcclCollectives>(device, id, rank, ranks);
}

bool built_with_nccl() {
  return true;
}

#else

namespace {
[[noreturn]] void no_nccl() {
  fail(
      "several ranks on GPUs need NCCL, and this build has none: install it (the CUDA "
      "toolkit's, or pip's nvidia-nccl-cu*) and rebuild, or run one rank");
}
}  // namespace

std::vector<uint8_t> new_nccl_id() {
  no_nccl();
}
std::unique_ptr<DeviceCollectives> make_nccl_collectives(Device&, const std::vector<uint8_t>&, int,
                                                         int) {
  no_nccl();
}
bool built_with_nccl() {
  return false;
}

#endif

}  // namespace layup
