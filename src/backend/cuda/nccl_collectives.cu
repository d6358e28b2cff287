// NcclCollectives: sum_in_rank_order, and ZeRO-1's reduce-scatter and all-gather, as
// Communicator's MPI versions do them, in device memory, on a communication stream of its own: a
// sum waits there for its fence (the end of the backward that wrote the gradient) and runs beside
// the compute issued after it.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <span>

#include "backend/cuda/cuda_backend_buffers.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_fence.h"
#include "backend/cuda/nccl_collectives.h"
#include "backend/cuda/nccl_library.h"
#include "core/error.h"

namespace layup {

namespace {

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
      : device_(device), nccl_(nccl::Library::get()), rank_(rank), ranks_(ranks) {
    nccl::UniqueId unique{};
    LAYUP_CHECK(id.size() == sizeof unique, "internal error: an NCCL id of ", id.size(),
                " bytes, not ", sizeof unique);
    std::memcpy(&unique, id.data(), sizeof unique);
    nccl_.check(nccl_.comm_init_rank(&comm_, ranks, unique, rank), "ncclCommInitRank");
    // A round's pieces from every rank: kNcclRoundFloats in all, whatever the model.
    received_ = device.allocate(cuda_collectives_buffers().at(0));
    // Non-blocking: a sum waits for its fence only, not for the compute issued after it.
    LAYUP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCollectives() override {
    cudaStreamSynchronize(stream_);
    nccl_.comm_destroy(comm_);
    cudaStreamDestroy(stream_);
  }

  // Ordered with the device's other work both ways: after all issued before it, before all issued
  // after it.
  void sum_in_rank_order(float* data, size_t count) override {
    device_.order_after(*start_sum_in_rank_order(device_, *device_.fence(), data, count));
  }

  std::shared_ptr<const DeviceFence> start_sum_in_rank_order(Device&, const DeviceFence& after,
                                                             float* data, size_t count) override {
    LAYUP_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<const CudaFence&>(after).event(), 0));
    sum_on_stream(data, count);
    return std::make_shared<CudaFence>(stream_);
  }

  // Every rank's copy of this rank's shard, received in rounds of at most kNcclRoundFloats / N
  // floats of each, added from +0 in rank order into the shard; the rest of `data` untouched.
  void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) override {
    check_bounds(bounds);
    wait_for_device();
    const size_t stride = kNcclRoundFloats / ranks_;
    const auto length = [&](int r) { return bounds[r + 1] - bounds[r]; };
    size_t longest = 0;
    for (int r = 0; r < ranks_; ++r) longest = std::max(longest, length(r));
    // Round j: the elements [j stride, (j + 1) stride) of every rank's shard.
    for (size_t first = 0; first < longest; first += stride) {
      const auto piece = [&](int r) {
        return length(r) > first ? std::min(stride, length(r) - first) : size_t{0};
      };
      const size_t mine = piece(rank_);
      nccl_.check(nccl_.group_start(), "ncclGroupStart");
      for (int r = 0; r < ranks_; ++r) {
        if (piece(r) > 0)
          nccl_.check(
              nccl_.send(data + bounds[r] + first, piece(r), nccl::kFloat32, r, comm_, stream_),
              "ncclSend");
        if (mine > 0)
          nccl_.check(
              nccl_.recv(received_.data() + r * stride, mine, nccl::kFloat32, r, comm_, stream_),
              "ncclRecv");
      }
      nccl_.check(nccl_.group_end(), "ncclGroupEnd");
      add_received(data + bounds[rank_] + first, mine);
    }
    order_device_after();
  }

  // This rank's shard to every other rank, theirs into `data` where they lie.
  void all_gather(float* data, std::span<const size_t> bounds) override {
    check_bounds(bounds);
    wait_for_device();
    const size_t mine = bounds[rank_ + 1] - bounds[rank_];
    nccl_.check(nccl_.group_start(), "ncclGroupStart");
    for (int r = 0; r < ranks_; ++r) {
      if (r == rank_) continue;
      if (mine > 0)
        nccl_.check(nccl_.send(data + bounds[rank_], mine, nccl::kFloat32, r, comm_, stream_),
                    "ncclSend");
      if (bounds[r + 1] > bounds[r])
        nccl_.check(nccl_.recv(data + bounds[r], bounds[r + 1] - bounds[r], nccl::kFloat32, r,
                               comm_, stream_),
                    "ncclRecv");
    }
    nccl_.check(nccl_.group_end(), "ncclGroupEnd");
    order_device_after();
  }

 private:
  void check_bounds(std::span<const size_t> bounds) const {
    LAYUP_CHECK(bounds.size() == static_cast<size_t>(ranks_) + 1,
                "internal error: shard bounds for ", bounds.size() - 1, " ranks, and ", ranks_,
                " run");
  }
  // The collectives' stream after the work the device issued so far...
  void wait_for_device() {
    LAYUP_CUDA_CHECK(
        cudaStreamWaitEvent(stream_, static_cast<const CudaFence&>(*device_.fence()).event(), 0));
  }
  // ... and the device's later work after the collectives'.
  void order_device_after() { device_.order_after(CudaFence(stream_)); }

  // out[0, count) = the ranks' pieces in received_ (rank r's at r * stride), added from +0 in
  // rank order, on stream_.
  void add_received(float* out, size_t count) {
    if (count == 0) return;
    const int threads = 256;
    const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 4096));
    add_in_rank_order<<<blocks, threads, 0, stream_>>>(out, received_.data(), ranks_,
                                                       kNcclRoundFloats / ranks_, count);
    LAYUP_CUDA_CHECK_LAUNCH();
  }

  // The rank-order sum of `count` floats at `data`, issued on stream_ (one sum at a time shares
  // received_: they run in the stream's order).
  void sum_on_stream(float* data, size_t count) {
    const cudaStream_t stream = stream_;
    const size_t stride = kNcclRoundFloats / ranks_;
    for (size_t first = 0; first < count; first += stride * ranks_) {
      const size_t n = std::min(stride * ranks_, count - first);
      // Piece r of the round: [n r / N, n (r + 1) / N), at most `stride` floats.
      const auto begin = [&](int r) { return first + n * r / ranks_; };
      const auto length = [&](int r) { return begin(r + 1) - begin(r); };
      const size_t mine = length(rank_);
      // Every rank's copy of my piece, rank r's at received_[r * stride].
      nccl_.check(nccl_.group_start(), "ncclGroupStart");
      for (int r = 0; r < ranks_; ++r) {
        nccl_.check(nccl_.send(data + begin(r), length(r), nccl::kFloat32, r, comm_, stream),
                    "ncclSend");
        nccl_.check(
            nccl_.recv(received_.data() + r * stride, mine, nccl::kFloat32, r, comm_, stream),
            "ncclRecv");
      }
      nccl_.check(nccl_.group_end(), "ncclGroupEnd");
      add_received(data + begin(rank_), mine);
      // The sums back to every rank.
      nccl_.check(nccl_.group_start(), "ncclGroupStart");
      for (int r = 0; r < ranks_; ++r) {
        if (r == rank_) continue;
        nccl_.check(nccl_.send(data + begin(rank_), mine, nccl::kFloat32, r, comm_, stream),
                    "ncclSend");
        nccl_.check(nccl_.recv(data + begin(r), length(r), nccl::kFloat32, r, comm_, stream),
                    "ncclRecv");
      }
      nccl_.check(nccl_.group_end(), "ncclGroupEnd");
    }
  }

  Device& device_;
  const nccl::Library& nccl_;
  int rank_ = 0, ranks_ = 1;
  nccl::Comm comm_ = nullptr;
  DeviceBuffer received_;
  cudaStream_t stream_ = nullptr;  // the communication stream
};

}  // namespace

std::vector<uint8_t> new_nccl_id() {
  const nccl::Library& nccl = nccl::Library::get();
  nccl::UniqueId unique{};
  nccl.check(nccl.get_unique_id(&unique), "ncclGetUniqueId");
  std::vector<uint8_t> id(sizeof unique);
  std::memcpy(id.data(), &unique, sizeof unique);
  return id;
}

std::unique_ptr<DeviceCollectives> make_nccl_collectives(Device& device,
                                                         const std::vector<uint8_t>& id, int rank,
                                                         int ranks) {
  return std::make_unique<NcclCollectives>(device, id, rank, ranks);
}

}  // namespace layup
