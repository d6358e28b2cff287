// CpuProgress: a wait returns once what it waits for has been reported (and sees what was written
// before the report), returns at once when nothing is outstanding, and throws once a task failed.
#include "schedule/cpu_progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "core/error.h"

namespace layup {
namespace {

using namespace std::chrono_literals;

TEST(CpuProgress, NothingOutstandingWaitsForNothing) {
  CpuProgress progress(3);
  progress.wait_consumed();
  progress.wait_head_landed();
  progress.wait_all_landed();
  progress.wait_transfers_landed();
  EXPECT_FALSE(progress.wait_landed(1));
}

TEST(CpuProgress, WaitsSeeWhatWasWrittenBeforeTheReport) {
  CpuProgress progress(2);
  int sum_of_squares = 0;  // written by the "consumer", read by the waiter
  progress.consume_submitted();
  std::thread consumer([&] {
    std::this_thread::sleep_for(2ms);
    sum_of_squares = 42;
    progress.consume_done();
  });
  progress.wait_consumed();
  EXPECT_EQ(sum_of_squares, 42);
  consumer.join();
}

TEST(CpuProgress, AForwardWaitsForItsSpansUpdateOnly) {
  CpuProgress progress(2);
  progress.update_submitted(1);
  progress.transfer_starting();
  EXPECT_FALSE(progress.wait_landed(0)) << "span 0 has nothing in flight";
  bool landed = false;
  std::thread transfer([&] {
    std::this_thread::sleep_for(2ms);
    landed = true;
    progress.update_landed(1);
  });
  // Whether this wait had to wait depends on how the threads were scheduled (a loaded machine
  // may land the update first); what it guarantees is that the update has landed when it returns.
  progress.wait_landed(1);
  EXPECT_TRUE(landed);
  EXPECT_FALSE(progress.wait_landed(1)) << "span 1's update has landed: nothing to wait for";
  transfer.join();
  progress.wait_all_landed();
  progress.wait_transfers_landed();
}

TEST(CpuProgress, AFailureEndsEveryWait) {
  CpuProgress progress(1);
  progress.consume_submitted();
  progress.update_submitted(0);
  std::thread task([&] {
    std::this_thread::sleep_for(2ms);
    progress.fail(std::make_exception_ptr(std::runtime_error("no memory for the landing")));
  });
  try {
    progress.wait_consumed();
    ADD_FAILURE() << "the wait did not throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no memory for the landing"), std::string::npos)
        << error.what();
  }
  task.join();
  EXPECT_THROW(progress.wait_landed(0), Error);
  EXPECT_THROW(progress.wait_all_landed(), Error);
  progress.fail("a second failure");  // the first one stays
  try {
    progress.wait_all_landed();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find("second"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace layup
