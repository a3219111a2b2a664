// Rollouts <-> DistQueue samples: what an actor puts and a learner takes.
#pragma once

#include <vector>

#include "src/io/in_flight_sample.h"
#include "src/rl/rollout.h"
#include "src/roles/queue_sample.h"

namespace rlf {

std::vector<QueueSample> to_queue_samples(const std::vector<Rollout>& rollouts, int group_size);
// Learners need tokens, behaviour log-probs, reward and advantage; the task sample keeps only
// its id (the prompt id).
std::vector<Rollout> to_rollouts(const std::vector<QueueSample>& samples);

// A batch an actor put into DistQueue, as a checkpoint saves it while no learner has taken it yet
// (disaggregated StaleSync): tokens, log-probs and versions. Rewards and advantages are not
// saved: they are a pure function of the responses and come back from score_rollouts.
std::vector<InFlightSample> to_in_flight(const std::vector<Rollout>& rollouts, int group_size);
// The batch back, unscored: prompts from the task, sample id = prompt id x group size + member.
std::vector<Rollout> unscored_rollouts(const std::vector<InFlightSample>& samples, const Task& task,
                                       int group_size);

}  // namespace rlf
