// The pair driver: alternates two passes at their exchanges.
#include "src/model/pass_pair.h"

#include "mpi_comm/links.h"

namespace rlf {

PairTime run_as_pair(ResumablePass& first, ResumablePass& second) {
  PassState first_state, second_state;
  // A running pass drives the other's exchange, if that one is stopped on one.
  auto drive = [](ResumablePass& other, const PassState& other_state) {
    return [&other, &other_state] {
      if (!other.done() && other_state.waiting_on) other_state.waiting_on->progress();
    };
  };
  first_state.between_pieces = drive(second, second_state);
  second_state.between_pieces = drive(first, first_state);
  PairTime time;
  auto timed = [](double& seconds, auto&& run) {
    const double begin = steady_seconds();
    run();
    seconds += steady_seconds() - begin;
  };
  timed(time.first, [&] { first.start(first_state); });
  timed(time.second, [&] { second.start(second_state); });
  while (!first.done() || !second.done()) {
    const bool first_ready = !first.done() && first.waiting_on().progress();
    const bool second_ready = !second.done() && second.waiting_on().progress();
    if (first_ready) {
      timed(time.first, [&] { first.resume(); });
    } else if (second_ready) {
      timed(time.second, [&] { second.resume(); });
    } else if (first.done() || second.done()) {
      ResumablePass& waiting = first.done() ? second : first;
      timed(first.done() ? time.second : time.first, [&] {
        SplitPhaseChain& chain = waiting.waiting_on();
        progress_until_finished(chain, {&chain});
      });
    } else {
      const double begin = steady_seconds();
      progress_until_any_finished({&first.waiting_on(), &second.waiting_on()});
      const double waited = steady_seconds() - begin;
      time.first += waited / 2;
      time.second += waited / 2;
    }
  }
  return time;
}

}  // namespace rlf
