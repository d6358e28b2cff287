// Communicator over MPI, or over nothing (one process); see communicator.h.
//
// sum_in_rank_order cuts the floats into one shard per rank. Each rank sends shard j of its data
// to rank j (MPI_Alltoallv), sums the shards it received in rank order, and the sums go back to
// every rank (MPI_Allgatherv): every float crosses the network twice, as in a ring all-reduce, and
// no reduction order is left to MPI's choice. It goes in rounds of 4 MiB, so its one buffer is that
// size, not the model's: like MPI's own buffers, it is part of the process's allowance in the
// memory plan rather than a planned tensor.
#include "comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/error.h"

#if LAYUP_HAVE_MPI
#include <mpi.h>
#endif

namespace layup {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  void broadcast(std::vector<uint8_t>&, int) override {}
  void sum_in_rank_order(float*, size_t) override {}
  std::vector<double> gather(double value) override { return {value}; }
  void reduce_scatter_in_rank_order(float*, std::span<const size_t>) override {}
  void all_gather(float*, std::span<const size_t>) override {}
  void all_gather(double*, std::span<const size_t>) override {}
  void send(const uint64_t*, size_t, int to) override { no_rank(to); }
  void receive(uint64_t*, size_t, int from) override { no_rank(from); }
  void send(const float*, size_t, int to) override { no_rank(to); }
  void receive(float*, size_t, int from) override { no_rank(from); }

 private:
  [[noreturn]] static void no_rank(int rank) {
    fail("internal error: rank ", rank, " addressed in a run of one process");
  }
};

// The ranks a launcher announced in the environment (Open MPI; MPICH and Slurm through PMI), or 1.
int launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  }
  return 1;
}

}  // namespace

int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(name)) return std::max(0, std::atoi(value));
  }
  return 0;
}

namespace {

#if LAYUP_HAVE_MPI

void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(status, text, &length);
  fail(call, " failed: ", std::string(text, length));
}

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // One thread at a time calls MPI, but not always the same one: layup's gradient consumer
      // sums each block's gradient during backward, the training thread the rest between steps.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
                "MPI_Init_thread");
      LAYUP_CHECK(provided >= MPI_THREAD_SERIALIZED,
                  "this MPI library cannot be called from more than one thread "
                  "(MPI_THREAD_SERIALIZED), which layup's schedules need; use another MPI build");
    }
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    // The ranks that share this host's memory: this rank's place among them.
    MPI_Comm host = MPI_COMM_NULL;
    check_mpi(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host),
        "MPI_Comm_split_type");
    check_mpi(MPI_Comm_rank(host, &local_rank_), "MPI_Comm_rank");
    MPI_Comm_free(&host);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  void broadcast(std::vector<uint8_t>& bytes, int root) override {
    check_mpi(
        MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, root, MPI_COMM_WORLD),
        "MPI_Bcast");
  }

  void sum_in_rank_order(float* data, size_t count) override {
    if (size_ == 1) return;
    // In rounds of at most kRoundFloats: the receive buffer stays that size whatever the model.
    // The sums are element by element, so the rounds do not change a bit.
    for (size_t first = 0; first < count; first += kRoundFloats)
      sum_round(data + first, std::min(kRoundFloats, count - first));
  }

  std::vector<double> gather(double value) override {
    std::vector<double> values(size_);
    check_mpi(MPI_Allgather(&value, 1, MPI_DOUBLE, values.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD),
              "MPI_Allgather");
    return values;
  }

  void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) override {
    check_bounds(bounds);
    // Round by round, each rank's next window of at most `window` floats of every shard: packed
    // into one send buffer so that MPI's int displacements stay small whatever the model.
    const size_t window = std::max<size_t>(1, kRoundFloats / size_);
    const size_t mine_at = bounds[rank_];
    packed_.resize(window * size_);
    received_.resize(window * size_);
    for (size_t at = 0; at < longest_shard(bounds); at += window) {
      std::vector<int> lengths(size_), starts(size_);
      for (int r = 0; r < size_; ++r) {
        const size_t shard = bounds[r + 1] - bounds[r];
        lengths[r] = static_cast<int>(at < shard ? std::min(window, shard - at) : 0);
        starts[r] = static_cast<int>(window * r);
        std::copy_n(data + bounds[r] + at, lengths[r], packed_.data() + window * r);
      }
      const int length = lengths[rank_];
      std::vector<int> receive_lengths(size_, length);
      check_mpi(
          MPI_Alltoallv(packed_.data(), lengths.data(), starts.data(), MPI_FLOAT, received_.data(),
                        receive_lengths.data(), starts.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Alltoallv");
      for (int i = 0; i < length; ++i) {
        float sum = 0.0f;  // +0, as in sum_round
        for (int r = 0; r < size_; ++r) sum += received_[window * r + i];
        data[mine_at + at + i] = sum;
      }
    }
  }

  void all_gather(float* data, std::span<const size_t> bounds) override {
    gather_shards(data, bounds, MPI_FLOAT);
  }
  void all_gather(double* data, std::span<const size_t> bounds) override {
    gather_shards(data, bounds, MPI_DOUBLE);
  }

  void send(const uint64_t* words, size_t count, int to) override {
    check_mpi(MPI_Send(words, static_cast<int>(count), MPI_UINT64_T, to, kWordsTag, MPI_COMM_WORLD),
              "MPI_Send");
  }
  void receive(uint64_t* words, size_t count, int from) override {
    check_mpi(MPI_Recv(words, static_cast<int>(count), MPI_UINT64_T, from, kWordsTag,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE),
              "MPI_Recv");
  }
  void send(const float* data, size_t count, int to) override {
    for (size_t at = 0; at < count; at += kRoundFloats)
      check_mpi(MPI_Send(data + at, static_cast<int>(std::min(kRoundFloats, count - at)), MPI_FLOAT,
                         to, kFloatsTag, MPI_COMM_WORLD),
                "MPI_Send");
  }
  void receive(float* data, size_t count, int from) override {
    for (size_t at = 0; at < count; at += kRoundFloats)
      check_mpi(MPI_Recv(data + at, static_cast<int>(std::min(kRoundFloats, count - at)), MPI_FLOAT,
                         from, kFloatsTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Recv");
  }

 private:
  // 4 MiB of floats: what one round of sum_in_rank_order exchanges.
  static constexpr size_t kRoundFloats = size_t{1} << 20;
  static constexpr int kWordsTag = 1, kFloatsTag = 2;

  void check_bounds(std::span<const size_t> bounds) const {
    LAYUP_CHECK(bounds.size() == static_cast<size_t>(size_) + 1 && bounds.front() == 0,
                "internal error: shard bounds for ", bounds.size() - 1, " ranks, not ", size_);
  }

  static size_t longest_shard(std::span<const size_t> bounds) {
    size_t longest = 0;
    for (size_t r = 0; r + 1 < bounds.size(); ++r)
      longest = std::max(longest, bounds[r + 1] - bounds[r]);
    return longest;
  }

  // all_gather for floats or doubles, in rounds of at most kRoundFloats elements a rank, through
  // a packed buffer as in reduce_scatter_in_rank_order.
  template <class T>
  void gather_shards(T* data, std::span<const size_t> bounds, MPI_Datatype type) {
    check_bounds(bounds);
    const size_t window = std::max<size_t>(1, kRoundFloats / size_);
    std::vector<T> mine(window), all(window * size_);
    for (size_t at = 0; at < longest_shard(bounds); at += window) {
      std::vector<int> lengths(size_), starts(size_);
      for (int r = 0; r < size_; ++r) {
        const size_t shard = bounds[r + 1] - bounds[r];
        lengths[r] = static_cast<int>(at < shard ? std::min(window, shard - at) : 0);
        starts[r] = static_cast<int>(window * r);
      }
      std::copy_n(data + bounds[rank_] + at, lengths[rank_], mine.data());
      check_mpi(MPI_Allgatherv(mine.data(), lengths[rank_], type, all.data(), lengths.data(),
                               starts.data(), type, MPI_COMM_WORLD),
                "MPI_Allgatherv");
      for (int r = 0; r < size_; ++r)
        if (r != rank_) std::copy_n(all.data() + window * r, lengths[r], data + bounds[r] + at);
    }
  }

  void sum_round(float* data, size_t count) {
    // Shard j: [start[j], start[j] + length[j]), as even as the count allows.
    std::vector<int> start(size_), length(size_);
    for (int j = 0; j < size_; ++j) {
      start[j] = static_cast<int>(count * j / size_);
      length[j] = static_cast<int>(count * (j + 1) / size_) - start[j];
    }
    const int mine = length[rank_];
    // Rank j's copy of my shard at received[j * mine].
    received_.resize(static_cast<size_t>(mine) * size_);
    std::vector<int> receive_lengths(size_, mine), receive_starts(size_);
    for (int j = 0; j < size_; ++j) receive_starts[j] = j * mine;
    check_mpi(
        MPI_Alltoallv(data, length.data(), start.data(), MPI_FLOAT, received_.data(),
                      receive_lengths.data(), receive_starts.data(), MPI_FLOAT, MPI_COMM_WORLD),
        "MPI_Alltoallv");
    float* shard = data + start[rank_];
    for (int i = 0; i < mine; ++i) {
      float sum = 0.0f;  // +0, as a fresh accumulator is: 0 + (-0) is +0
      for (int j = 0; j < size_; ++j) sum += received_[static_cast<size_t>(j) * mine + i];
      shard[i] = sum;
    }
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, length.data(), start.data(),
                             MPI_FLOAT, MPI_COMM_WORLD),
              "MPI_Allgatherv");
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::vector<float> received_;  // at most kRoundFloats
  std::vector<float> packed_;    // reduce_scatter_in_rank_order's send buffer, as large
};

#endif

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcess>();
}

std::unique_ptr<Communicator> make_world_communicator() {
  const int launched = launched_ranks();
#if LAYUP_HAVE_MPI
  if (launched > 1) return std::make_unique<MpiWorld>();
#else
  LAYUP_CHECK(launched == 1, "a launcher started ", launched,
              " ranks, but this layup was built without MPI: install libopenmpi-dev and rebuild "
              "(CMake finds it), or run one process");
#endif
  return make_single_process_communicator();
}

void abort_other_ranks(int exit_code) {
#if LAYUP_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int size = 1;
  if (initialized && !finalized) MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
#else
  (void)exit_code;
#endif
}

void finish_ranks() {
#if LAYUP_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
#endif
}

bool built_with_mpi() {
#if LAYUP_HAVE_MPI
  return true;
#else
  return false;
#endif
}

}  // namespace layup
