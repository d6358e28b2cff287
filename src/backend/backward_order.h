// Which backward call a backend takes next (the order of model_backend.h: backward_head, blocks
// L-1 down to 0, backward_embeddings; a parked micro-batch resumes at any of them). Each backend
// keeps one and checks every call against it before computing.
#pragma once

#include <string>

#include "core/error.h"

namespace layup {

class BackwardOrder {
 public:
  explicit BackwardOrder(int n_layer) : n_layer_(n_layer) {}

  // A forward (whole or layer-major) or a decode has begun: the last backward is over and its
  // resumed activations are gone. A layer-major forward keeps the blocks' inputs in the stores
  // only, so a block's backward then needs resume first.
  void forward_started(bool layer_major) {
    next_ = Step::kNeedsForwardWithTargets;
    resumed_ = false;
    layer_major_ = layer_major;
  }
  // The forward's loss against its targets is known: backward_head may follow.
  void loss_computed() { next_ = Step::kHead; }

  // `why_once` says why, on this backend, one forward allows one backward only (empty where the
  // same backward may run again).
  void check_head(const std::string& why_once) const {
    LAYUP_CHECK(next_ != Step::kNeedsForwardWithTargets,
                "backward_head needs a forward pass with targets first", why_once);
    LAYUP_CHECK(next_ == Step::kHead,
                "backward_head called in the middle of a backward pass; finish it with the "
                "blocks and backward_embeddings first");
  }
  void head_done() {
    next_ = Step::kBlock;
    next_layer_ = n_layer_ - 1;
  }

  void check_block(int layer) const {
    LAYUP_CHECK(next_ == Step::kBlock && layer == next_layer_, "backward_block(", layer,
                ") is out of order: backward runs backward_head, then blocks ", n_layer_ - 1,
                " down to 0, then backward_embeddings",
                next_ == Step::kBlock ? "; the next block is " + std::to_string(next_layer_) : "");
    LAYUP_CHECK(resumed_ || !layer_major_, "backward_block(", layer,
                ") after a layer-major forward needs resume_micro_batch first: the blocks' "
                "inputs are in the stores");
  }
  void block_done(int layer) {
    next_layer_ = layer - 1;
    if (layer == 0) next_ = Step::kEmbeddings;
  }

  void check_embeddings() const {
    LAYUP_CHECK(next_ == Step::kEmbeddings,
                "backward_embeddings called before the backward of block 0");
  }
  // `repeatable`: the forward's activations are intact, so the same backward may run again.
  void embeddings_done(bool repeatable) {
    next_ = repeatable ? Step::kHead : Step::kNeedsForwardWithTargets;
  }

  void check_park() const {
    LAYUP_CHECK(next_ == Step::kBlock || next_ == Step::kEmbeddings,
                "park_micro_batch belongs between a micro-batch's backward calls (after its "
                "backward_head or a block's)");
  }
  // A micro-batch resumed at `layer` (-1: the embeddings): its backward goes on from there, each
  // block's computing the block's forward again from its stored input.
  void resumed_at(int layer) {
    next_ = layer >= 0 ? Step::kBlock : Step::kEmbeddings;
    next_layer_ = layer;
    resumed_ = true;
  }

  // No backward may follow before a forward with targets.
  bool awaits_forward() const { return next_ == Step::kNeedsForwardWithTargets; }
  // A micro-batch was resumed since the last forward: the blocks' activations are not kept.
  bool resumed() const { return resumed_; }

 private:
  enum class Step { kNeedsForwardWithTargets, kHead, kBlock, kEmbeddings };

  int n_layer_;
  Step next_ = Step::kNeedsForwardWithTargets;
  int next_layer_ = -1;
  bool resumed_ = false;
  bool layer_major_ = false;
};

}  // namespace layup
