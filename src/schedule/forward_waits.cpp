// ForwardWaits: a wait per span, and the forward's trace spans around them.
#include "schedule/forward_waits.h"

#include <utility>

#include "trace/trace_recorder.h"

namespace layup {

namespace {

// "<what> <part>", with " <layer>" for a block.
std::string span_name(const char* what, const char* part, int layer) {
  std::string name = what;
  name += ' ';
  name += part;
  if (layer >= 0) {
    name += ' ';
    name += std::to_string(layer);
  }
  return name;
}

}  // namespace

ForwardWaits::ForwardWaits(const CpuProgress& progress, size_t final_norm, TraceRecorder* trace,
                           int track, std::function<void(size_t span)> before_span)
    : progress_(progress),
      final_norm_(final_norm),
      trace_(trace != nullptr && trace->recording() ? trace : nullptr),
      track_(track),
      before_span_(std::move(before_span)) {}

void ForwardWaits::enter(size_t span, const char* part, const char* update, int layer) {
  close();
  const double wait_start_us = trace_ != nullptr ? trace_->now_us() : 0.0;
  const bool waited = progress_.wait_landed(span);
  if (before_span_) before_span_(span);
  if (trace_ == nullptr) return;
  open_part_ = part;
  open_layer_ = layer;
  open_start_us_ = trace_->now_us();
  if (waited)
    trace_->add_span(track_, span_name("wait_update", update, layer), wait_start_us,
                     open_start_us_);
}

void ForwardWaits::close() {
  if (trace_ == nullptr || open_part_ == nullptr) return;
  trace_->add_span(track_, span_name("forward", open_part_, open_layer_), open_start_us_,
                   trace_->now_us());
  open_part_ = nullptr;
}

}  // namespace layup
