// The figures a multi-rank `train` reports back to its caller.
#pragma once

namespace rlf {

// What a multi-rank train measured, the same on every rank (`bench modes` compares two runs).
struct TrainResult {
  double tokens_per_s = 0;         // RL tokens trained per second of RL wall time
  double rl_seconds = 0;           // RL wall time (learner 0)
  double weight_sync_seconds = 0;  // learner 0's time sending weights to the actors
  double accuracy_before_rl = 0, accuracy_after_rl = 0;
  // The busiest rank's time in each half of RL: generation (Generate events) and training
  // (Reference, Proximal and Train events). StaleSync's overlap bound is (G + T) / max(G, T).
  double generate_seconds = 0, train_seconds = 0;
  // Idle events of RL summed over ranks (the long-tail bubble and waits for other ranks), and
  // the same as a share of the ranks' RL time.
  double idle_seconds = 0, idle_share = 0;
};

}  // namespace rlf
