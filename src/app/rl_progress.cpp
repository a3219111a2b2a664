#include "src/app/rl_progress.h"

#include <cstdio>

namespace rlf {

RlProgress::RlProgress(RunDirectory& dir, int steps, int log_every, const Arena& device)
    : dir_(dir), steps_(steps), log_every_(log_every), device_(device) {}

void RlProgress::start() {
  dir_.log("# %6s %8s %8s %8s %8s %7s %10s %12s %9s\n", "step", "reward", "acc", "resp-len", "kl",
           "clip", "tokens/s", "device-peak", "eta");
  start_ = window_start_ = Clock::now();
}

void RlProgress::step_done(int step, const StepStats& stats) {
  window_.add(stats);
  if (step % log_every_ != 0 && step != steps_) return;
  const auto now = Clock::now();
  const double window_seconds = std::chrono::duration<double>(now - window_start_).count();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  dir_.log("  %6d %8.3f %8.3f %8.2f %8.4f %7.3f %10.0f %12s %9s\n", step, window_.mean_reward(),
           window_.accuracy(), window_.mean_response(), window_.kl_per_token(),
           window_.clip_fraction(), window_.tokens / window_seconds,
           format_bytes(device_.peak() + (outside_arena_ ? outside_arena_() : 0)).c_str(),
           format_duration(elapsed / step * (steps_ - step)).c_str());
  window_ = StepStats{};
  window_start_ = now;
}

double RlProgress::seconds_since_start() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

std::string format_duration(double seconds) {
  char buf[32];
  const int s = int(seconds + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace rlf
