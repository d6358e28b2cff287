// The ranks of a data-parallel run and the collectives the schedules need from them: one process
// (every run without a launcher) or the processes `mpirun` started (MPI_COMM_WORLD, CPU memory).
// docs/parallel.md says how a step splits across ranks and why the sums keep it bitwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace layup {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its host (0 ..): which of the host's GPUs it takes.
  virtual int local_rank() const = 0;
  // `bytes` of rank `root` copied into every other rank's (the same size on every rank).
  virtual void broadcast(std::vector<uint8_t>& bytes, int root) = 0;
  // Every rank's `count` floats summed element by element, into every rank's `data` (host
  // memory), starting from +0 and adding rank 0's, then rank 1's, ...: the float additions one
  // process makes summing the same values in that order, so the result is the same bits on every
  // rank and the same as that process's.
  virtual void sum_in_rank_order(float* data, size_t count) = 0;
  // Every rank's `value`, indexed by rank.
  virtual std::vector<double> gather(double value) = 0;

  // Sharded vectors (ZeRO-1, docs/parallel.md): rank r owns elements [bounds[r], bounds[r + 1])
  // of a vector; `bounds` has size() + 1 entries, from 0 to the vector's length, non-decreasing.
  // Every rank's `data` summed as sum_in_rank_order sums it, into the shard this rank owns only;
  // the rest of this rank's `data` is left as it was.
  virtual void reduce_scatter_in_rank_order(float* data, std::span<const size_t> bounds) = 0;
  // Every rank's own shard of `data` copied into the others' `data`.
  virtual void all_gather(float* data, std::span<const size_t> bounds) = 0;
  virtual void all_gather(double* data, std::span<const size_t> bounds) = 0;
  // Point to point, in order between two ranks: a rank asking another for part of what it owns.
  virtual void send(const uint64_t* words, size_t count, int to) = 0;
  virtual void receive(uint64_t* words, size_t count, int from) = 0;
  virtual void send(const float* data, size_t count, int to) = 0;
  virtual void receive(float* data, size_t count, int from) = 0;
  // Every rank's `value` added from +0 in rank order (the same on every rank).
  double sum_in_rank_order(double value) {
    double sum = 0.0;
    for (const double rank_value : gather(value)) sum += rank_value;
    return sum;
  }
};

// A run of one process: rank 0 of 1; the sums leave the data as it is.
std::unique_ptr<Communicator> make_single_process_communicator();

// The ranks an MPI launcher started (MPI_COMM_WORLD), initialising MPI on first use; one process
// when none did (no launcher in the environment). Throws layup::Error where a launcher started
// several ranks but this build has no MPI.
std::unique_ptr<Communicator> make_world_communicator();

// This process's rank as the launcher announced it in the environment (0 without a launcher),
// readable before MPI starts: whether it is the rank that prints.
int launched_rank();

// The end of a command that succeeded: MPI finalised if it was started (every rank calls it).
void finish_ranks();

// The end of a command that failed: where several ranks run, the others would wait in a
// collective for ever, so the failing one ends them all (MPI_Abort). Nothing without MPI running.
void abort_other_ranks(int exit_code);

// Whether this build can run several ranks (it was built with MPI).
bool built_with_mpi();

}  // namespace layup
