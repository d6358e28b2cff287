// BackwardOrder: the backward calls a backend takes after each forward, and the message of each
// refusal (both backends' call-order checks are this class).
#include "backend/backward_order.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace layup {
namespace {

constexpr int kLayers = 3;

// Expects `call` to throw an Error whose message contains `what`.
void expect_refused(const std::function<void()>& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "not refused (expected \"" << what << "\")";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(what), std::string::npos)
        << "message: " << error.what();
  }
}

// One whole backward after the order's last forward, each call checked first.
void run_backward(BackwardOrder& order) {
  order.check_head("");
  order.head_done();
  for (int layer = kLayers - 1; layer >= 0; --layer) {
    order.check_block(layer);
    order.block_done(layer);
  }
  order.check_embeddings();
}

TEST(BackwardOrder, TakesTheHeadTheBlocksDownwardThenTheEmbeddings) {
  BackwardOrder order(kLayers);
  order.forward_started(/*layer_major=*/false);
  order.loss_computed();
  EXPECT_FALSE(order.awaits_forward());
  expect_refused([&] { order.check_block(kLayers - 1); }, "is out of order");
  expect_refused([&] { order.check_embeddings(); }, "before the backward of block 0");
  expect_refused([&] { order.check_park(); }, "belongs between");
  order.check_head("");
  order.head_done();
  expect_refused([&] { order.check_head(""); }, "in the middle of a backward pass");
  expect_refused([&] { order.check_block(0); }, "the next block is 2");
  order.check_block(2);
  order.check_park();
  order.block_done(2);
  expect_refused([&] { order.check_block(2); }, "the next block is 1");
  order.block_done(1);
  order.block_done(0);
  expect_refused([&] { order.check_block(0); }, "is out of order");
  order.check_embeddings();
  order.check_park();
  EXPECT_FALSE(order.resumed());
}

TEST(BackwardOrder, AfterTheEmbeddingsARepeatableBackwardMayRunAgain) {
  BackwardOrder order(kLayers);
  order.forward_started(false);
  order.loss_computed();
  run_backward(order);
  order.embeddings_done(/*repeatable=*/true);
  run_backward(order);
  order.embeddings_done(/*repeatable=*/false);
  EXPECT_TRUE(order.awaits_forward());
  expect_refused([&] { order.check_head(" (why once)"); },
                 "needs a forward pass with targets first (why once)");
}

TEST(BackwardOrder, AForwardWithoutTargetsAllowsNoBackward) {
  BackwardOrder order(kLayers);
  expect_refused([&] { order.check_head(""); }, "needs a forward pass with targets first");
  order.forward_started(false);
  order.loss_computed();
  order.check_head("");
  order.forward_started(false);  // the next forward, or a decode, has no targets
  EXPECT_TRUE(order.awaits_forward());
  expect_refused([&] { order.check_head(""); }, "needs a forward pass with targets first");
}

TEST(BackwardOrder, ALayerMajorForwardsBlocksNeedResumeFirst) {
  BackwardOrder order(kLayers);
  order.forward_started(/*layer_major=*/true);
  order.loss_computed();
  order.check_head("");
  order.head_done();
  expect_refused([&] { order.check_block(2); }, "needs resume_micro_batch first");
  order.resumed_at(2);
  EXPECT_TRUE(order.resumed());
  order.check_block(2);
  order.block_done(2);
  order.resumed_at(-1);  // a parked micro-batch resumes at its embeddings
  expect_refused([&] { order.check_block(1); }, "is out of order");
  order.check_embeddings();
  order.forward_started(/*layer_major=*/false);
  EXPECT_FALSE(order.resumed());
}

}  // namespace
}  // namespace layup
