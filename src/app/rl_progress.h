// Progress lines of the RL steps, shared by the one-rank and the multi-rank `train`: a header,
// then one line every --log-every steps averaging the steps since the previous line (reward,
// accuracy, response length, KL, clipped fraction, tokens/s, device-memory peak, ETA).
#pragma once

#include <chrono>

#include "kernels/arena.h"
#include "src/io/run_directory.h"
#include "src/rl/rl_step.h"

namespace rlf {

class RlProgress {
 public:
  RlProgress(RunDirectory& dir, int steps, int log_every, const Arena& device);
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
  Clock::time_point start_, window_start_;
  StepStats window_;
};

// "h:mm:ss".
std::string format_duration(double seconds);

}  // namespace rlf
