// Split-phase chains of nonblocking exchanges: progress by MPI_Testall, deadlines, sleeping waits.
#include "mpi_comm/split_phase.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <thread>

#include "mpi_comm/links.h"
#include "mpi_comm/wait_policy.h"

namespace rlf {

void SplitPhaseChain::start(std::vector<Step> steps) {
  if (!finished()) throw std::logic_error("SplitPhaseChain: a chain is still in flight");
  started_at_ = steady_seconds();
  steps_ = std::move(steps);
  next_ = 0;
  requests_.clear();
  deadline_ = 0;
  advance();
  time_.exposed += steady_seconds() - started_at_;
}

void SplitPhaseChain::complete_no_earlier_than(double deadline) {
  deadline_ = std::max(deadline_, deadline);
}

bool SplitPhaseChain::progress() {
  if (finished()) return true;
  const double begin = steady_seconds();
  const bool done = advance();
  time_.exposed += steady_seconds() - begin;
  return done;
}

bool SplitPhaseChain::advance() {
  while (!finished()) {
    if (!requests_.empty()) {
      int done = 0;
      MPI_Testall(int(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
      if (!done) return false;
      requests_.clear();
    }
    if (steady_seconds() < deadline_) return false;
    if (next_ == steps_.size()) {
      steps_.clear();  // releases what the steps captured
      time_.in_flight += steady_seconds() - started_at_;
      break;
    }
    deadline_ = 0;
    // The step may throw; the chain then stays in flight and the dispatcher is unusable, as
    // after any failed collective.
    ++steps_run_;
    steps_[next_++]();
  }
  return true;
}

double SplitPhaseChain::ready_in(double unknown) const {
  if (finished()) return 0;
  if (!requests_.empty()) return unknown;
  return std::max(0.0, deadline_ - steady_seconds());
}

namespace {

bool any_finished(const std::vector<SplitPhaseChain*>& targets) {
  for (const SplitPhaseChain* t : targets)
    if (t->finished()) return true;
  return false;
}

// progress_until_finished over several targets: returns once any of them has finished.
void progress_until_first(const std::vector<SplitPhaseChain*>& targets,
                          const std::vector<SplitPhaseChain*>& chains) {
  constexpr double kShortest = 1e-6, kLongest = 1e-3;
  double backoff = kShortest;
  // Nothing known to be ready: poll (yielding the core) for poll_before_sleep_seconds() after the
  // last step that moved before sleeping; a known emulated deadline is still slept to.
  double quiet_since = steady_seconds();
  for (;;) {
    // The targets first: a step they post now is ahead of the others' for the emulated link.
    bool done = false;
    for (SplitPhaseChain* t : targets) done = t->progress() || done;
    if (done) return;
    size_t steps_before = 0;
    for (const SplitPhaseChain* t : targets) steps_before += t->steps_run();
    for (SplitPhaseChain* chain : chains) {
      steps_before += chain->steps_run();
      chain->progress();
    }
    // `chains` may hold a target: done now, it must not sleep (or yield the core) first.
    if (any_finished(targets)) return;
    const bool polling = steady_seconds() - quiet_since < poll_before_sleep_seconds();
    const double unknown = polling ? 0.0 : backoff;
    double sleep = std::numeric_limits<double>::infinity();
    for (const SplitPhaseChain* chain : chains) {
      if (!chain->finished()) sleep = std::min(sleep, chain->ready_in(unknown));
    }
    for (const SplitPhaseChain* t : targets) sleep = std::min(sleep, t->ready_in(unknown));
    const double idle_from = steady_seconds();
    if (sleep > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep));
    } else {
      std::this_thread::yield();
    }
    for (SplitPhaseChain* t : targets) t->add_exposed(steady_seconds() - idle_from);
    size_t steps_after = 0;
    for (const SplitPhaseChain* t : targets) steps_after += t->steps_run();
    for (const SplitPhaseChain* chain : chains) steps_after += chain->steps_run();
    // Something moved: the next messages may come soon too.
    if (steps_after != steps_before) {
      backoff = kShortest;
      quiet_since = steady_seconds();
    } else if (!polling) {
      backoff = std::min(2 * backoff, kLongest);
    }
  }
}

}  // namespace

void progress_until_finished(SplitPhaseChain& target, const std::vector<SplitPhaseChain*>& chains) {
  progress_until_first({&target}, chains);
}

void progress_until_any_finished(const std::vector<SplitPhaseChain*>& targets) {
  progress_until_first(targets, {});
}

}  // namespace rlf
