// A pass through a model's layers (a forward or a backward) that stops at every expert-parallel
// exchange and is resumed once the exchange has completed: a C++20 coroutine. The layers co_await
// a child pass (a layer, a MoE block), an exchange (`co_await exchange(chain)` between a
// dispatcher's begin_* and finish_*) or a progress point (between pieces of compute). Whoever
// drives the pass decides what runs while it waits: run_to_end waits for the exchange (the
// blocking path, the same bits and the same timing accounting as begin_* then finish_*);
// run_as_pair (src/model/pass_pair.h) runs a second pass meanwhile.
#pragma once

#include <coroutine>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "mpi_comm/split_phase.h"

namespace rlf {

// What the driver of a pass sees: where it stopped and on what. Shared by a pass and every child
// it awaits.
struct PassState {
  std::coroutine_handle<> resume_at;      // the innermost suspended frame
  SplitPhaseChain* waiting_on = nullptr;  // the exchange it waits for (set while suspended)
  // The pass's other exchanges in flight while it waits (overlap chunks: the next chunk's dispatch,
  // the previous ones' combines), which whoever waits must progress too; null: none.
  const std::vector<SplitPhaseChain*>* in_flight = nullptr;
  // Called at every progress point of the pass (a paired driver: the other pass's exchange).
  std::function<void()> between_pieces;
  // Stop at every exchange, also one already finished: the stops are then the same on every rank
  // whatever the messages do (a driver that switches passes at them in a fixed order).
  bool stop_at_every_exchange = false;
};

class [[nodiscard]] ResumablePass {
 public:
  struct promise_type;
  using Handle = std::coroutine_handle<promise_type>;

  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    // A child hands control back to the pass that awaited it; the outermost pass to its driver.
    std::coroutine_handle<> await_suspend(Handle h) noexcept {
      const std::coroutine_handle<> next = h.promise().continuation;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };

  struct promise_type {
    PassState* state = nullptr;
    std::coroutine_handle<> continuation;
    std::exception_ptr error;
    ResumablePass get_return_object() { return ResumablePass(Handle::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };

  ResumablePass(ResumablePass&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  ResumablePass& operator=(ResumablePass&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ResumablePass(const ResumablePass&) = delete;
  ResumablePass& operator=(const ResumablePass&) = delete;
  ~ResumablePass() {
    if (handle_) handle_.destroy();
  }

  // Awaited by another pass: runs inside it, sharing its driver's state.
  struct ChildAwaiter {
    Handle child;
    bool await_ready() noexcept { return false; }
    std::coroutine_handle<> await_suspend(Handle parent) noexcept {
      child.promise().state = parent.promise().state;
      child.promise().continuation = parent;
      return child;
    }
    void await_resume() {
      if (child.promise().error) std::rethrow_exception(child.promise().error);
    }
  };
  ChildAwaiter operator co_await() && noexcept { return {handle_}; }

  // Driver side. Runs the pass until its first stop (or its end) under `state`.
  void start(PassState& state) {
    handle_.promise().state = &state;
    state.resume_at = handle_;
    resume();
  }
  // Runs it on from where it stopped until the next stop (or its end).
  void resume() {
    PassState& state = *handle_.promise().state;
    state.waiting_on = nullptr;
    state.in_flight = nullptr;
    state.resume_at.resume();
    if (done() && handle_.promise().error) std::rethrow_exception(handle_.promise().error);
  }
  bool done() const { return handle_.done(); }
  // The exchange a stopped pass waits for.
  SplitPhaseChain& waiting_on() const { return *handle_.promise().state->waiting_on; }
  // Progresses that exchange and the pass's others in flight once (no allocation: a paired pass
  // calls it at each of its progress points).
  void progress_exchanges() const {
    const PassState& state = *handle_.promise().state;
    state.waiting_on->progress();
    if (state.in_flight) {
      for (SplitPhaseChain* chain : *state.in_flight)
        if (chain != state.waiting_on) chain->progress();
    }
  }
  // What waiting for it must progress: that exchange and the pass's others in flight.
  std::vector<SplitPhaseChain*> chains_to_progress() const {
    const PassState& state = *handle_.promise().state;
    std::vector<SplitPhaseChain*> chains{state.waiting_on};
    if (state.in_flight) {
      for (SplitPhaseChain* chain : *state.in_flight)
        if (chain != state.waiting_on) chains.push_back(chain);
    }
    return chains;
  }

 private:
  explicit ResumablePass(Handle handle) : handle_(handle) {}
  Handle handle_;
};

// Awaited between a dispatcher's begin_* and finish_*: the pass stops until `chain` has finished
// (not at all when it already has, unless its state says stop_at_every_exchange). `in_flight`
// (may hold `chain`; must outlive the stop): the pass's other exchanges in flight meanwhile, which
// the driver progresses while it waits.
struct ExchangeAwaiter {
  SplitPhaseChain& chain;
  const std::vector<SplitPhaseChain*>* in_flight = nullptr;
  bool await_ready() const noexcept { return false; }
  bool await_suspend(ResumablePass::Handle h) const noexcept {
    PassState& state = *h.promise().state;
    if (chain.finished() && !state.stop_at_every_exchange) return false;
    state.resume_at = h;
    state.waiting_on = &chain;
    state.in_flight = in_flight;
    return true;
  }
  void await_resume() const noexcept {}
};
inline ExchangeAwaiter exchange(SplitPhaseChain& chain,
                                const std::vector<SplitPhaseChain*>* in_flight = nullptr) {
  return {chain, in_flight};
}

// Awaited between pieces of compute: lets the driver progress other exchanges (Open MPI moves a
// nonblocking transfer only inside MPI calls); never stops the pass.
struct ProgressPoint {
  bool await_ready() const noexcept { return false; }
  bool await_suspend(ResumablePass::Handle h) const {
    if (h.promise().state->between_pieces) h.promise().state->between_pieces();
    return false;
  }
  void await_resume() const noexcept {}
};
inline ProgressPoint progress_point() {
  return {};
}

// Awaited before a pass cuts its compute into pieces: whether anything runs at its progress
// points (a paired driver). Without, one call does the work of the pieces with the same bits and
// none of their extra kernel calls and thread barriers. Never stops the pass.
struct PiecesWanted {
  bool wanted = false;
  bool await_ready() const noexcept { return false; }
  bool await_suspend(ResumablePass::Handle h) noexcept {
    wanted = bool(h.promise().state->between_pieces);
    return false;
  }
  bool await_resume() const noexcept { return wanted; }
};
inline PiecesWanted pieces_wanted() {
  return {};
}

// Runs `pass` to its end, waiting out every exchange it stops at (progress_until_finished).
void run_to_end(ResumablePass pass);

}  // namespace rlf
