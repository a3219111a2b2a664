// Split-phase (nonblocking) exchanges driven by explicit progress calls. Open MPI moves a
// nonblocking transfer only inside MPI calls, so a computation that wants its messages to move
// while it works calls progress() between pieces of work. Link emulation is a completion deadline
// (Links::schedule_arrival): a waiter sleeps out only what is left of it, so emulated link time
// can be hidden behind computation.
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

namespace rlf {

// A chain of steps. Each step does some CPU work and posts nonblocking messages (add_request,
// complete_no_earlier_than); the next step runs once every request of the previous one has
// completed and its deadline has passed. The last step posts nothing and finishes the chain.
class SplitPhaseChain {
 public:
  using Step = std::function<void()>;

  // Where the chains' time went, summed since construction (what an overlap hides): in_flight,
  // each chain from its start to the progress call that saw it finish (completion is seen only
  // inside such calls, so a chain driven between pieces of work counts up to one piece late);
  // exposed, the caller's time spent on it outside any other work: inside start() and progress()
  // (its steps' CPU work and MPI's), and the sleeps of progress_until_finished waiting for it.
  // A blocking exchange (start, then progress_until_finished) is exposed from start to finish.
  struct Time {
    double in_flight = 0, exposed = 0;
  };

  // Runs steps[0] now. Throws std::logic_error when a chain is still in flight.
  void start(std::vector<Step> steps);
  // Tests the outstanding requests (MPI_Testall drives Open MPI's progress engine) and runs the
  // following steps as they become ready. True when the chain has finished (or none started).
  bool progress();
  bool finished() const { return steps_.empty(); }
  // Steps run since construction (waiters see whether anything moved).
  size_t steps_run() const { return steps_run_; }
  // After progress(): seconds a waiter may sleep before this chain can advance. 0 when finished;
  // `unknown` while MPI requests are outstanding (their completion cannot be predicted); else
  // what is left of the deadline.
  double ready_in(double unknown) const;
  const Time& time() const { return time_; }
  // progress_until_finished: the time it slept (or yielded) waiting for this chain.
  void add_exposed(double seconds) { time_.exposed += seconds; }

  // For steps: a request they posted, and the earliest time (steady_seconds()) the step may
  // complete.
  void add_request(MPI_Request request) { requests_.push_back(request); }
  void complete_no_earlier_than(double deadline);

 private:
  std::vector<Step> steps_;
  size_t next_ = 0, steps_run_ = 0;
  std::vector<MPI_Request> requests_;
  double deadline_ = 0;
  double started_at_ = 0;
  Time time_;
  bool advance();  // progress() without the timing
};

// The share of the communication time that did not hold the caller up: 1 - exposed / in_flight
// (0 without communication; about 0 for blocking exchanges, below 0 when driving the chains cost
// more than they ran beside other work).
inline double hidden_fraction(const SplitPhaseChain::Time& t) {
  return t.in_flight > 0 ? 1 - t.exposed / t.in_flight : 0;
}

// Drives every chain of `chains` until `target` has finished. Between rounds it yields the core
// while polling (poll_before_sleep_seconds(), wait_policy.h: without end when every rank has a
// core of its own), then sleeps: back-off sleeps from 1 us to 1 ms while MPI requests are
// outstanding, and at most until the nearest deadline; when only deadlines are left, one sleep
// to the nearest.
void progress_until_finished(SplitPhaseChain& target, const std::vector<SplitPhaseChain*>& chains);
// The same until any of `targets` has finished (two passes run as a pair, each waiting on its
// exchange); the time slept counts as exposed on every target still in flight.
void progress_until_any_finished(const std::vector<SplitPhaseChain*>& targets);

}  // namespace rlf
