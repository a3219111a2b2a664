// Progress lines of the RL steps, shared by the one-rank and the multi-rank `train`: a header,
// then one line every --log-every steps averaging the steps since the previous line (reward,
// accuracy, response length, KL, clipped fraction, tokens/s, device-memory peak, ETA; with
// pipeline parallelism the peak includes the stage's activation arenas).
#pragma once

#include <chrono>
#include <functional>

#include "kernels/arena.h"
#include "src/io/run_directory.h"
#include "src/rl/rl_step.h"

namespace rlf {

class RlProgress {
 public:
  RlProgress(RunDirectory& dir, int steps, int log_every, const Arena& device);
  // Device memory held outside `device` that its peak column adds: a pipeline stage's activation
  // arenas (PipelineTrainer::activation_bytes_held).
  void count_outside_arena(std::function<size_t()> held_bytes) {
    outside_arena_ = std::move(held_bytes);
  }
  // Prints the column header and starts the clock.
  void start();
  // Adds one step's statistics (summed over learners) and prints a line when one is due.
  void step_done(int step, const StepStats& stats);
  double seconds_since_start() const;

 private:
  using Clock = std::chrono::steady_clock;
  RunDirectory& dir_;
  int steps_, log_every_;
  const Arena& device_;
  std::function<size_t()> outside_arena_;
  Clock::time_point start_, window_start_;
  StepStats window_;
};

// "h:mm:ss".
std::string format_duration(double seconds);

}  // namespace rlf
