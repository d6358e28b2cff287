// ForwardWaits: the hooks of every forward of the layup schedule (ForwardHooks, model_backend.h).
// Before a span's weights are read, the forward waits until the span's update of the last step
// has landed in the device copy (CpuProgress::wait_landed), and a streamed block for its slot's
// fill. With a trace, each span's forward
// ("forward embeddings", "forward block l", "forward head", from the end of its wait to the next
// hook or the end of the forward) and every wait that was needed ("wait_update ...") go on the
// device track.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "backend/model_backend.h"
#include "schedule/cpu_progress.h"

namespace layup {

class TraceRecorder;

class ForwardWaits final : public ForwardHooks {
 public:
  // `final_norm`: the final norm's span index (the last). `trace` may be null. `before_span`
  // (may be empty) runs after a span's wait, before its weights are read: where a streamed
  // block's weights come into the device (its ring slot's fill).
  ForwardWaits(const CpuProgress& progress, size_t final_norm, TraceRecorder* trace, int track,
               std::function<void(size_t span)> before_span = {});

  void before_embeddings() override { enter(0, "embeddings", "embeddings", -1); }
  void before_block(int layer) override { enter(1 + layer, "block", "block", layer); }
  void before_head() override { enter(final_norm_, "head", "final_norm", -1); }
  // Ends the last span's record; call when the forward has returned.
  void finish() { close(); }

 private:
  // What the forward reads next: span `span`, recorded as "forward <part>[ layer]"; a wait for
  // its update as "wait_update <update>[ layer]".
  void enter(size_t span, const char* part, const char* update, int layer);
  void close();

  const CpuProgress& progress_;
  const size_t final_norm_;
  TraceRecorder* const trace_;  // null: not recording
  const int track_;
  const std::function<void(size_t span)> before_span_;
  const char* open_part_ = nullptr;  // the span whose forward is running (null before the first)
  int open_layer_ = -1;
  double open_start_us_ = 0.0;
};

}  // namespace layup
