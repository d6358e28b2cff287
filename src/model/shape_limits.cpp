// The limits of a run's shape and the flag each breach is blamed on (shape_limits.h).
#include "model/shape_limits.h"

#include <algorithm>
#include <array>
#include <limits>

#include "core/error.h"

namespace layup {

namespace {

constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMaxInt = std::numeric_limits<int>::max();

// Saturating arithmetic: a size past 64 bits stays past every limit instead of wrapping under one.
uint64_t times(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? kSaturated : product;
}
template <class... More>
uint64_t times(uint64_t a, uint64_t b, More... more) {
  return times(times(a, b), more...);
}
uint64_t plus(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? kSaturated : sum;
}
template <class... More>
uint64_t plus(uint64_t a, uint64_t b, More... more) {
  return plus(plus(a, b), more...);
}

struct Shape {
  ModelConfig config;
  int batch = 1;
  int seq_len = 1;
};

// A flag of the shape and the field it sets.
struct Knob {
  const char* flag;
  int& (*field)(Shape&);
};
// In blame order: the model's own sizes first, then what one micro-batch adds to them.
constexpr std::array<Knob, 6> kKnobs = {{
    {"--dim", [](Shape& s) -> int& { return s.config.n_embd; }},
    {"--heads", [](Shape& s) -> int& { return s.config.n_head; }},
    {"--layers", [](Shape& s) -> int& { return s.config.n_layer; }},
    {"--context", [](Shape& s) -> int& { return s.config.n_positions; }},
    {"--seq-len", [](Shape& s) -> int& { return s.seq_len; }},
    {"--batch", [](Shape& s) -> int& { return s.batch; }},
}};

// The limit `shape` goes past first, as a phrase; empty when it is within them all. The sizes are
// upper bounds of what the layout and the backends' carves take (every bias and norm statistic
// counted in every block), computed in 64 bits without the config's int helpers, which would
// overflow first.
std::string limit_passed(const Shape& shape) {
  const ModelConfig& c = shape.config;
  const uint64_t C = std::max(c.n_embd, 1), NH = std::max(c.n_head, 1);
  const uint64_t KV = c.n_kv_head > 0 ? c.n_kv_head : NH;
  const uint64_t D = c.head_size > 0 ? uint64_t(c.head_size) : C / NH;
  const uint64_t M = c.intermediate_size > 0 ? uint64_t(c.intermediate_size) : times(4, C);
  const uint64_t F = c.is_llama() ? times(2, M) : M;
  const uint64_t Q = times(plus(NH, times(2, KV)), D), A = times(NH, D);
  const uint64_t V = std::max(c.padded_vocab_size, 1), P = std::max(c.n_positions, 1);
  const uint64_t L = std::max(c.n_layer, 1), B = shape.batch, T = shape.seq_len;

  if (std::max({M, F, Q, A}) > kMaxInt)
    return "a weight matrix more than 2147483647 rows tall, past the model's 32-bit widths (the "
           "MLP is 4 x --dim rows, q, k and v together 3 x --dim)";
  if (L > uint64_t{kMaxLayers})
    return "more than " + std::to_string(kMaxLayers) +
           " blocks, past what layup keeps records for (each block costs the plan and the "
           "schedules their own records)";
  const uint64_t block =
      plus(times(Q, C), Q, times(C, A), times(F, C), F, times(C, M), times(6, C));
  const uint64_t parameters = plus(times(2, V, C), times(P, C), times(L, block), times(2, C));
  if (parameters > kMaxShapeElements)
    return "more than 2^50 parameters (4 PiB in fp32), past what the memory plan's 64-bit sizes "
           "count";
  const uint64_t tokens = times(B, T);
  if (tokens > kMaxInt)
    return "more than 2147483647 tokens in a micro-batch (--batch x --seq-len), past what the "
           "backends index with 32-bit integers";
  const uint64_t row = plus(times(7, C), Q, A, F, M, 4);
  const uint64_t activations = plus(times(tokens, plus(times(plus(L, 2), row), V)),
                                    times(L, B, NH, T, T), times(T, D), uint64_t{1} << 24);
  if (activations > kMaxShapeElements)
    return "a micro-batch whose activations count more than 2^50 elements (4 PiB in fp32), past "
           "what the memory plan's 64-bit sizes count";
  return "";
}

}  // namespace

std::string ShapeLimitBreach::message() const {
  if (flag.empty()) return "the model is too large: " + limit + "; choose a smaller --model";
  return flag + " " + std::to_string(value) + " is too large: " + limit + "; use " + flag + " " +
         std::to_string(largest) + " or less";
}

std::optional<ShapeLimitBreach> shape_limit_breach(const ModelConfig& config, int batch,
                                                   int seq_len) {
  Shape given{config, batch, seq_len};
  // A size below 1 is not a size: validate_config and the flags' own checks refuse it.
  for (const Knob& knob : kKnobs)
    if (knob.field(given) < 1) return std::nullopt;
  Shape probe = given;
  for (const Knob& knob : kKnobs) knob.field(probe) = 1;
  if (std::string limit = limit_passed(probe); !limit.empty())
    return ShapeLimitBreach{"", 0, 0, std::move(limit)};
  for (const Knob& knob : kKnobs) {
    const int value = knob.field(given);
    knob.field(probe) = value;
    std::string limit = limit_passed(probe);
    if (limit.empty()) continue;
    // Within at 1 (the probe before this flag), past at `value`: the largest within, by bisection.
    int lo = 1, hi = value;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      knob.field(probe) = mid;
      (limit_passed(probe).empty() ? lo : hi) = mid;
    }
    return ShapeLimitBreach{knob.flag, value, lo, std::move(limit)};
  }
  return std::nullopt;
}

void check_shape_limits(const ModelConfig& config, int batch, int seq_len) {
  if (const std::optional<ShapeLimitBreach> breach = shape_limit_breach(config, batch, seq_len))
    fail(breach->message());
}

}  // namespace layup
