#include "src/roles/rollout_samples.h"

namespace rlf {

std::vector<QueueSample> to_queue_samples(const std::vector<Rollout>& rollouts, int group_size) {
  std::vector<QueueSample> samples;
  samples.reserve(rollouts.size());
  for (const Rollout& r : rollouts) {
    QueueSample s;
    s.sample_id = r.sample_id;
    s.prompt_id = r.task_sample.id;
    s.group_index = int32_t(r.sample_id % group_size);
    s.version_min = r.version_min;
    s.version_max = r.version_max;
    s.reward = float(r.reward);
    s.advantage = float(r.advantage);
    s.status = SampleStatus::Finished;
    s.prompt.assign(r.prompt.begin(), r.prompt.end());
    s.response.assign(r.response.begin(), r.response.end());
    s.behaviour_logp = r.behaviour_logp;
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<Rollout> to_rollouts(const std::vector<QueueSample>& samples) {
  std::vector<Rollout> rollouts;
  rollouts.reserve(samples.size());
  for (const QueueSample& s : samples) {
    Rollout r;
    r.sample_id = s.sample_id;
    r.task_sample.id = s.prompt_id;
    r.prompt.assign(s.prompt.begin(), s.prompt.end());
    r.response.assign(s.response.begin(), s.response.end());
    r.behaviour_logp = s.behaviour_logp;
    r.version_min = s.version_min;
    r.version_max = s.version_max;
    r.reward = s.reward;
    r.advantage = s.advantage;
    rollouts.push_back(std::move(r));
  }
  return rollouts;
}

std::vector<InFlightSample> to_in_flight(const std::vector<Rollout>& rollouts, int group_size) {
  std::vector<InFlightSample> samples;
  samples.reserve(rollouts.size());
  for (const Rollout& r : rollouts) {
    InFlightSample s;
    s.prompt_id = r.task_sample.id;
    s.member = int32_t(r.sample_id % group_size);
    s.finished = true;
    s.version_min = r.version_min;
    s.version_max = r.version_max;
    s.response.assign(r.response.begin(), r.response.end());
    s.behaviour_logp = r.behaviour_logp;
    samples.push_back(std::move(s));
  }
  return samples;
}

std::vector<Rollout> unscored_rollouts(const std::vector<InFlightSample>& samples, const Task& task,
                                       int group_size) {
  std::vector<Rollout> rollouts;
  rollouts.reserve(samples.size());
  for (const InFlightSample& s : samples) {
    Rollout r;
    r.sample_id = s.prompt_id * group_size + s.member;
    r.task_sample = task.train_sample(s.prompt_id);
    r.prompt = prompt_tokens(r.task_sample);
    r.response.assign(s.response.begin(), s.response.end());
    r.behaviour_logp = s.behaviour_logp;
    r.version_min = s.version_min;
    r.version_max = s.version_max;
    rollouts.push_back(std::move(r));
  }
  return rollouts;
}

}  // namespace rlf
