// One sample as it travels through DistQueue from an actor to a learner: the metadata a learner
// needs to weight and schedule it (ids, versions for the staleness bound, reward, advantage) and
// its token and log-prob arrays at their true lengths.
#pragma once

#include <cstdint>
#include <vector>

namespace rlf {

// Finished: the response ended (<eos> or length limit). Partial: a long-tail rollout cut by
// StaleSync's finished-sample threshold; it continues generating later and may carry tokens of
// several policy versions (version_min < version_max).
enum class SampleStatus : uint8_t { Finished = 0, Partial = 1 };

struct QueueSample {
  int64_t sample_id = 0;    // unique over a run; also keys the sampler's random stream
  int64_t prompt_id = 0;    // the training prompt this response answers
  int32_t group_index = 0;  // index of the response within its prompt's group (0..G-1)
  int32_t version_min = 0;  // oldest policy version that produced any of its tokens
  int32_t version_max = 0;  // newest policy version that produced any of its tokens
  float reward = 0;
  float advantage = 0;
  SampleStatus status = SampleStatus::Finished;
  std::vector<int32_t> prompt;
  std::vector<int32_t> response;
  std::vector<float> behaviour_logp;  // one per response token, at generation time

  // Field by field, floats by value: tests compare a sample that crossed the wire with the one
  // that was put (packing copies the bits, so only a NaN reward would compare unequal).
  bool operator==(const QueueSample&) const = default;
};

}  // namespace rlf
