// Rollouts <-> DistQueue samples: what an actor puts and a learner takes.
#pragma once

#include <vector>

#include "src/rl/rollout.h"
#include "src/roles/queue_sample.h"

namespace rlf {

std::vector<QueueSample> to_queue_samples(const std::vector<Rollout>& rollouts, int group_size);
// Learners need tokens, behaviour log-probs, reward and advantage; the task sample keeps only
// its id (the prompt id).
std::vector<Rollout> to_rollouts(const std::vector<QueueSample>& samples);

}  // namespace rlf
