// The pair driver (src/model/pass_pair.h) really interleaves two resumable passes: each pass's
// exchange here is a generalized MPI request that only the other pass completes, so run one after
// the other they would wait forever, and run as a pair they finish in the one order the exchanges
// allow, each pass's end reported at once. In the alternating order (PairOrder::Alternating) the
// passes take turns even where one could run on. Exceptions of either pass reach the driver's
// caller. No timing: the order is forced.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_comm/split_phase.h"
#include "src/model/pass_pair.h"
#include "src/model/resumable_pass.h"

namespace rlf {
namespace {

// An exchange that completes when someone calls MPI_Grequest_complete on `request`.
struct ForcedExchange {
  SplitPhaseChain chain;
  MPI_Request request = MPI_REQUEST_NULL;

  void begin() {
    chain.start({[this] {
                   MPI_Grequest_start(
                       [](void*, MPI_Status* status) {
                         MPI_Status_set_elements(status, MPI_BYTE, 0);
                         MPI_Status_set_cancelled(status, 0);
                         status->MPI_SOURCE = MPI_UNDEFINED;
                         status->MPI_TAG = MPI_UNDEFINED;
                         return MPI_SUCCESS;
                       },
                       [](void*) { return MPI_SUCCESS; }, [](void*, int) { return MPI_SUCCESS; },
                       nullptr, &request);
                   chain.add_request(request);
                 },
                 [] {}});
  }
  void complete() { MPI_Grequest_complete(request); }
};

// Logs `name` + "0", begins its exchange, lets the other pass's exchange complete, waits for its
// own, then logs `name` + "1" and completes the other one's second exchange if it has one.
ResumablePass logged_pass(std::string name, ForcedExchange& mine, ForcedExchange& theirs,
                          std::vector<std::string>& log, bool completes_theirs_first) {
  log.push_back(name + "0");
  mine.begin();
  if (completes_theirs_first) theirs.complete();
  co_await exchange(mine.chain);
  log.push_back(name + "1");
  if (!completes_theirs_first) theirs.complete();
}

TEST(PassPair, RunsTheOtherPassWhileOneWaitsForItsExchange) {
  ForcedExchange a, b;
  std::vector<std::string> log;
  // A begins and stops (only B completes A's exchange); B completes it, begins its own and stops;
  // A runs on and completes B's; B ends.
  ResumablePass first = logged_pass("A", a, b, log, /*completes_theirs_first=*/false);
  ResumablePass second = logged_pass("B", b, a, log, /*completes_theirs_first=*/true);
  // Each pass's end is reported as soon as it ends: A's before B has run on.
  const PairTime time = run_as_pair(first, second, [&](int pass) {
    log.push_back(std::string(pass == 0 ? "A" : "B") + " ended");
  });
  EXPECT_TRUE(first.done());
  EXPECT_TRUE(second.done());
  EXPECT_EQ(log, (std::vector<std::string>{"A0", "B0", "A1", "A ended", "B1", "B ended"}));
  EXPECT_GE(time.first, 0.0);
  EXPECT_GE(time.second, 0.0);
  // Both exchanges were timed as in flight.
  EXPECT_GT(a.chain.time().in_flight, 0.0);
  EXPECT_GT(b.chain.time().in_flight, 0.0);
}

// Two exchanges, each completed and found finished by its own pass before it awaits it (as an
// exchange whose messages had all arrived): logs `name` + "0", "1", "2" between them.
ResumablePass self_completing_pass(std::string name, ForcedExchange& first_exchange,
                                   ForcedExchange& second_exchange, std::vector<std::string>& log) {
  log.push_back(name + "0");
  for (ForcedExchange* e : {&first_exchange, &second_exchange}) {
    e->begin();
    e->complete();
    EXPECT_TRUE(e->chain.progress());
    co_await exchange(e->chain);
    log.push_back(name + (e == &first_exchange ? "1" : "2"));
  }
}

// Both passes' exchanges have finished when awaited: by completion the first runs through them
// to its end before the second starts; alternating, the passes stop at every exchange all the
// same and take turns (the same stops and order on every rank whatever the messages do, which
// passes holding a TP group's collectives need).
TEST(PassPair, AlternatingOrderTakesTurnsAtEveryExchangeWhereCompletionOrderRunsOn) {
  for (const PairOrder order : {PairOrder::ByCompletion, PairOrder::Alternating}) {
    ForcedExchange a1, a2, b1, b2;
    std::vector<std::string> log;
    ResumablePass first = self_completing_pass("A", a1, a2, log);
    ResumablePass second = self_completing_pass("B", b1, b2, log);
    run_as_pair(first, second, {}, order);
    EXPECT_TRUE(first.done());
    EXPECT_TRUE(second.done());
    const std::vector<std::string> want =
        order == PairOrder::Alternating
            ? std::vector<std::string>{"A0", "B0", "A1", "B1", "A2", "B2"}
            : std::vector<std::string>{"A0", "A1", "A2", "B0", "B1", "B2"};
    EXPECT_EQ(log, want);
  }
}

// The forced order of the first test holds alternating too: each pass waits its turn for the
// exchange only the other completes.
TEST(PassPair, AlternatingOrderWaitsForTheExchangeTheOtherPassCompletes) {
  ForcedExchange a, b;
  std::vector<std::string> log;
  ResumablePass first = logged_pass("A", a, b, log, /*completes_theirs_first=*/false);
  ResumablePass second = logged_pass("B", b, a, log, /*completes_theirs_first=*/true);
  run_as_pair(first, second, {}, PairOrder::Alternating);
  EXPECT_EQ(log, (std::vector<std::string>{"A0", "B0", "A1", "B1"}));
}

ResumablePass failing_pass(ForcedExchange& mine) {
  mine.begin();
  co_await exchange(mine.chain);
  throw std::runtime_error("pass failed after its exchange");
}

ResumablePass completing_pass(ForcedExchange& theirs) {
  theirs.complete();
  co_return;
}

TEST(PassPair, AnExceptionOfAPassReachesTheCaller) {
  ForcedExchange a;
  ResumablePass first = failing_pass(a);
  ResumablePass second = completing_pass(a);
  EXPECT_THROW(run_as_pair(first, second), std::runtime_error);
}

}  // namespace
}  // namespace rlf
