// HostGradient: landing, adding and squaring a span's gradient on the host.
#include "schedule/host_gradient.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "optim/grad_norm.h"

namespace layup {

namespace {

// Sum-of-squares chunks a worker adds and squares at a time (1 MiB): small enough that the piece
// is still in the worker's cache when it is squared.
constexpr size_t kPassChunks = 4;
// Sum-of-squares chunks the staging buffer holds (16 MiB, two slots of 8): one transfer per piece
// of a later micro-batch's gradient, long enough to run at the interconnect's full rate.
constexpr size_t kStagingChunks = 64;

// Pieces of a later micro-batch's gradient handed from the thread that copies them into staging
// slots to the thread that adds them, piece p in slot p % slots. A side that fails stops both.
class PieceHandoff {
 public:
  explicit PieceHandoff(size_t slots) : slots_(slots) {}

  // The copier, before piece p: until the piece that last used its slot has been added. False
  // once either side has failed.
  bool await_free_slot(size_t p) {
    return await([&] { return p < added_ + slots_; });
  }
  void landed() { bump(landed_); }
  // The adder, before piece p: until it has landed. False once either side has failed.
  bool await_landed(size_t p) {
    return await([&] { return p < landed_; });
  }
  void added() { bump(added_); }

  void fail(std::exception_ptr error) {
    {
      const std::lock_guard lock(mutex_);
      if (!error_) error_ = std::move(error);
    }
    changed_.notify_all();
  }
  bool failed() {
    const std::lock_guard lock(mutex_);
    return error_ != nullptr;
  }
  void rethrow_if_failed() {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  template <class Ready>
  bool await(Ready ready) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return error_ || ready(); });
    return !error_;
  }
  void bump(size_t& counter) {
    {
      const std::lock_guard lock(mutex_);
      ++counter;
    }
    changed_.notify_all();
  }

  const size_t slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t landed_ = 0, added_ = 0;
  std::exception_ptr error_;
};

}  // namespace

HostGradient::Buffers HostGradient::buffers(const ParameterLayout& layout, const PackedSpans& spans,
                                            DeviceKinds kinds) {
  size_t largest_span = 0;
  for (size_t index = 0; index < layout.spans().size(); ++index)
    if (spans.holds(index)) largest_span = std::max(largest_span, layout.spans()[index].count);
  const size_t staging = std::min(largest_span, kStagingChunks * kSumOfSquaresChunk);
  return {{MemorySide::kHost, TensorClass::kWeightGrads, kinds.host_copy,
           spans.count * sizeof(float), "fp32 gradient accumulated over micro-batches"},
          {MemorySide::kHost, TensorClass::kWeightGrads, kinds.host_copy, staging * sizeof(float),
           "staging of later micro-batches' gradients"}};
}

HostGradient::HostGradient(Device& device, const ParameterLayout& layout, const PackedSpans& spans,
                           HostAdamW& workers, SpanSquareSums& device_sums)
    : device_(device),
      layout_(layout),
      spans_(spans),
      workers_(workers),
      device_sums_(device_sums) {
  const Buffers listed = buffers(layout, spans, device.kinds());
  grads_ = device.allocate(listed.accumulator);
  staging_ = device.allocate(listed.staging);
}

double HostGradient::accumulate(const DeviceFence& written, const float* device_grad, size_t index,
                                bool first, bool last, const std::function<void()>& copied) {
  const size_t count = layout_.spans()[index].count;
  const size_t chunks = sum_of_squares_chunks(count);
  const bool host_sums = last && !first;  // one micro-batch: the device took the sum
  std::vector<double> chunk_sums(host_sums ? chunks : 0, 0.0);
  float* accumulated = span(index);
  const auto element_pass = [&](size_t first_chunk, size_t end_chunk,
                                const std::function<void(size_t, size_t)>& combine) {
    chunked_pass(accumulated, count, first_chunk, end_chunk, combine,
                 host_sums ? chunk_sums.data() : nullptr);
  };

  if (first) {
    land(written, device_grad, index);
    if (copied) copied();
    // One micro-batch: the gradient as the backward wrote it, as gpu mode uses it, and the sum
    // of squares the device took: no host pass at all (host bandwidth is what the step is bound
    // by).
    if (last) return device_sums_.take(index);
    // 0 + g in place: what adding into a zeroed accumulator gives (a -0 gradient becomes +0), as
    // gpu mode's sum over micro-batches starts.
    element_pass(0, chunks, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) accumulated[i] = 0.0f + accumulated[i];
    });
  } else {
    std::lock_guard lock(staging_mutex_);
    // The staging buffer in two slots where it holds two chunks or more: this thread copies the
    // next piece into one while a helper has the workers add the last from the other, so a
    // span takes max(copy, add) a piece instead of their sum. Each element still gets one add in
    // micro-batch order: the bits do not change.
    const size_t staging_chunks = staging_.count() / kSumOfSquaresChunk;
    const size_t slots = staging_chunks >= 2 ? 2 : 1;
    const size_t piece_chunks = std::max<size_t>(1, staging_chunks / slots);
    const size_t pieces = (chunks + piece_chunks - 1) / piece_chunks;
    const auto slot = [&](size_t piece) {
      return staging_.data() + (piece % slots) * piece_chunks * kSumOfSquaresChunk;
    };
    PieceHandoff handoff(slots);
    {
      const std::jthread adder([&] {
        try {
          for (size_t p = 0; p < pieces && handoff.await_landed(p); ++p) {
            const size_t c = p * piece_chunks, c_end = std::min(chunks, c + piece_chunks);
            const float* staged = slot(p);
            const size_t piece_begin = c * kSumOfSquaresChunk;
            element_pass(c, c_end, [&](size_t begin, size_t end) {
              for (size_t i = begin; i < end; ++i) accumulated[i] += staged[i - piece_begin];
            });
            handoff.added();
          }
        } catch (...) {
          handoff.fail(std::current_exception());
        }
      });
      try {
        for (size_t p = 0; p < pieces && handoff.await_free_slot(p); ++p) {
          const size_t begin = p * piece_chunks * kSumOfSquaresChunk;
          const size_t end = std::min(count, (p + 1) * piece_chunks * kSumOfSquaresChunk);
          device_.copy_to_host_after(written, slot(p), device_grad + begin, end - begin);
          handoff.landed();
        }
        // Out of device memory: the device may overwrite it while the last adds run.
        if (!handoff.failed() && copied) copied();
      } catch (...) {
        handoff.fail(std::current_exception());
      }
    }  // the adder has finished
    handoff.rethrow_if_failed();
  }
  return host_sums ? add_chunk_sums(chunk_sums.data(), chunks) : 0.0;
}

void HostGradient::land(const DeviceFence& written, const float* device_grad, size_t index) {
  device_.copy_to_host_after(written, span(index), device_grad, layout_.spans()[index].count);
}

double HostGradient::sum_over_ranks(size_t index, Communicator& ranks) {
  const size_t count = layout_.spans()[index].count;
  float* summed = span(index);
  ranks.sum_in_rank_order(summed, count);
  const size_t chunks = sum_of_squares_chunks(count);
  std::vector<double> chunk_sums(chunks, 0.0);
  chunked_pass(summed, count, 0, chunks, {}, chunk_sums.data());
  return add_chunk_sums(chunk_sums.data(), chunks);
}

double HostGradient::reduce_scatter(size_t index, Communicator& ranks,
                                    const OptimizerShards& shards) {
  const Span& whole = layout_.spans()[index];
  float* summed = span(index);
  ranks.reduce_scatter_in_rank_order(
      summed, shards.bounds_within(whole.offset, whole.offset + whole.count));
  // Shards are cut where chunks start, so this rank's part is whole chunks of the span.
  const std::vector<size_t> chunk_bounds = shards.chunk_bounds_of(index);
  const size_t chunks = chunk_bounds.back();
  std::vector<double> chunk_sums(chunks, 0.0);
  const int rank = ranks.rank();
  chunked_pass(summed, whole.count, chunk_bounds[rank], chunk_bounds[rank + 1], {},
               chunk_sums.data());
  ranks.all_gather(chunk_sums.data(), chunk_bounds);
  return add_chunk_sums(chunk_sums.data(), chunks);
}

void HostGradient::chunked_pass(const float* squared, size_t count, size_t first_chunk,
                                size_t end_chunk,
                                const std::function<void(size_t, size_t)>& combine,
                                double* chunk_sums) {
  // Whole chunks per worker, so that each chunk's sum is one worker's chain in index order.
  workers_.run_on_workers([&](int worker, int workers) {
    const size_t n = end_chunk - first_chunk;
    const size_t my_end = first_chunk + n * (worker + 1) / workers;
    for (size_t c = first_chunk + n * worker / workers; c < my_end; c += kPassChunks) {
      const size_t c_end = std::min(my_end, c + kPassChunks);
      if (combine) combine(c * kSumOfSquaresChunk, std::min(count, c_end * kSumOfSquaresChunk));
      if (chunk_sums != nullptr) chunk_sums_of_squares(squared, count, c, c_end, chunk_sums);
    }
  });
}

}  // namespace layup
