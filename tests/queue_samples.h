// Seeded random QueueSamples for the packing and DistQueue tests. A sample is a pure function of
// (seed, sample_id), so a receiving rank can rebuild what the sender put and compare exactly.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "src/roles/queue_sample.h"

namespace rlf::test {

struct SampleShape {
  int max_prompt = 12;
  int max_response = 40;
  double empty_response_fraction = 0.15;  // responses cut before their first token
  int max_version = 5;
};

inline QueueSample random_sample(uint64_t seed, int64_t sample_id, const SampleShape& shape = {}) {
  std::mt19937_64 gen(seed ^ (uint64_t(sample_id) * 0x9E3779B97F4A7C15ull));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  QueueSample s;
  s.sample_id = sample_id;
  s.prompt_id = sample_id / 4;
  s.group_index = int32_t(sample_id % 4);
  s.version_min = uniform(0, shape.max_version);
  s.version_max = s.version_min + uniform(0, 1);
  s.reward = float(uniform(0, 1));
  s.advantage = std::uniform_real_distribution<float>(-2, 2)(gen);
  s.status = uniform(0, 4) == 0 ? SampleStatus::Partial : SampleStatus::Finished;
  s.prompt.resize(size_t(uniform(0, shape.max_prompt)));
  const bool empty =
      std::uniform_real_distribution<double>(0, 1)(gen) < shape.empty_response_fraction;
  s.response.resize(empty ? 0 : size_t(uniform(1, shape.max_response)));
  for (auto& t : s.prompt) t = uniform(0, 255);
  for (auto& t : s.response) t = uniform(0, 255);
  for (size_t i = 0; i < s.response.size(); ++i)
    s.behaviour_logp.push_back(std::uniform_real_distribution<float>(-8, 0)(gen));
  return s;
}

inline std::vector<QueueSample> random_batch(uint64_t seed, int64_t first_id, int count,
                                             const SampleShape& shape = {}) {
  std::vector<QueueSample> batch;
  for (int i = 0; i < count; ++i) batch.push_back(random_sample(seed, first_id + i, shape));
  return batch;
}

}  // namespace rlf::test
