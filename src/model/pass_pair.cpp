// The pair driver: alternates two passes at their exchanges.
#include "src/model/pass_pair.h"

#include <algorithm>
#include <vector>

#include "mpi_comm/links.h"

namespace rlf {

PairTime run_as_pair(ResumablePass& first, ResumablePass& second,
                     const std::function<void(int pass)>& ended, PairOrder order) {
  PassState first_state, second_state;
  // A running pass drives the other's exchange, if that one is stopped on one.
  auto drive = [](ResumablePass& other, const PassState& other_state) {
    return [&other, &other_state] {
      if (!other.done() && other_state.waiting_on) other.progress_exchanges();
    };
  };
  first_state.between_pieces = drive(second, second_state);
  second_state.between_pieces = drive(first, first_state);
  // Alternating: the turns change at every exchange, finished or not, so that every rank stops
  // (and switches) at the same places.
  first_state.stop_at_every_exchange = second_state.stop_at_every_exchange =
      order == PairOrder::Alternating;
  PairTime time;
  bool reported[2] = {false, false};
  // Runs a piece of pass `index` and reports its end once.
  auto timed = [&](int index, auto&& run) {
    const double begin = steady_seconds();
    run();
    (index == 0 ? time.first : time.second) += steady_seconds() - begin;
    if (ended && (index == 0 ? first : second).done() && !reported[index]) {
      reported[index] = true;
      ended(index);
    }
  };
  timed(0, [&] { first.start(first_state); });
  timed(1, [&] { second.start(second_state); });
  if (order == PairOrder::Alternating) {
    for (int turn = 0; !first.done() || !second.done(); turn ^= 1) {
      ResumablePass& pass = turn == 0 ? first : second;
      ResumablePass& other = turn == 0 ? second : first;
      if (pass.done()) continue;
      // Its exchange may still be in flight: wait it out, the other's progressing meanwhile.
      SplitPhaseChain& chain = pass.waiting_on();
      if (!chain.progress()) {
        const double begin = steady_seconds();
        std::vector<SplitPhaseChain*> chains = pass.chains_to_progress();
        if (!other.done()) {
          const std::vector<SplitPhaseChain*> others = other.chains_to_progress();
          chains.insert(chains.end(), others.begin(), others.end());
        }
        progress_until_finished(chain, chains);
        (turn == 0 ? time.first : time.second) += steady_seconds() - begin;
      }
      timed(turn, [&] { pass.resume(); });
    }
    return time;
  }
  while (!first.done() || !second.done()) {
    const bool first_ready = !first.done() && first.waiting_on().progress();
    const bool second_ready = !second.done() && second.waiting_on().progress();
    if (first_ready) {
      timed(0, [&] { first.resume(); });
    } else if (second_ready) {
      timed(1, [&] { second.resume(); });
    } else if (first.done() || second.done()) {
      ResumablePass& waiting = first.done() ? second : first;
      timed(first.done() ? 1 : 0,
            [&] { progress_until_finished(waiting.waiting_on(), waiting.chains_to_progress()); });
    } else {
      const double begin = steady_seconds();
      // Both stopped: the two exchanges they wait for, and their other exchanges still in flight
      // (overlap chunks), until one of them finishes.
      std::vector<SplitPhaseChain*> chains = {&first.waiting_on(), &second.waiting_on()};
      for (const ResumablePass* pass : {&first, &second}) {
        for (SplitPhaseChain* chain : pass->chains_to_progress()) {
          if (!chain->finished() && std::find(chains.begin(), chains.end(), chain) == chains.end())
            chains.push_back(chain);
        }
      }
      progress_until_any_finished(chains);
      const double waited = steady_seconds() - begin;
      time.first += waited / 2;
      time.second += waited / 2;
    }
  }
  return time;
}

}  // namespace rlf
