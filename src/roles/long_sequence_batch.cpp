#include "src/roles/long_sequence_batch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/error.h"
#include "kernels/rng.h"

namespace rlf {

namespace {

// Random streams of sample i: its two lengths, then its tokens and log-probs. Offsets keep the
// streams of different purposes apart for any sample id below 2^40.
constexpr uint64_t kLengthStream = 0, kTokenStream = uint64_t(1) << 40;

int draw_length(const LengthDistribution& d, uint64_t seed, int64_t id, uint64_t which) {
  const double z = philox_normal(seed, kLengthStream + uint64_t(id), which);
  const double length = d.median * std::exp(d.sigma * z);
  return int(std::lround(std::clamp(length, 1.0, double(d.max))));
}

void check(const LengthDistribution& d, const char* option) {
  const std::string name(option);
  if (!(d.median > 0)) throw ConfigError(name + "-median must be > 0");
  if (!(d.sigma >= 0 && d.sigma <= 4)) throw ConfigError(name + "-sigma must be in [0, 4]");
  if (d.max < 1) throw ConfigError(name + "-max must be >= 1");
}

}  // namespace

std::string LengthDistribution::describe() const {
  char text[128];
  std::snprintf(text, sizeof text, "lognormal(median %g, sigma %.2f) capped at %d", median, sigma,
                max);
  return text;
}

void validate_long_sequence_shape(const LongSequenceShape& shape) {
  check(shape.prompt, "--long-prompt");
  check(shape.response, "--long-response");
  if (shape.vocab_size < 1) throw ConfigError("vocabulary size must be >= 1");
}

std::vector<QueueSample> long_sequence_batch(const LongSequenceShape& shape, int count,
                                             uint64_t seed) {
  validate_long_sequence_shape(shape);
  std::vector<QueueSample> batch(size_t(std::max(count, 0)));
  for (int i = 0; i < count; ++i) {
    QueueSample& s = batch[size_t(i)];
    s.sample_id = s.prompt_id = i;
    s.reward = 1;
    s.prompt.resize(size_t(draw_length(shape.prompt, seed, i, 0)));
    s.response.resize(size_t(draw_length(shape.response, seed, i, 1)));
    s.behaviour_logp.resize(s.response.size());
    const uint64_t stream = kTokenStream + uint64_t(i);
    uint64_t position = 0;
    for (auto* tokens : {&s.prompt, &s.response}) {
      for (int32_t& token : *tokens) {
        const uint64_t word = random_words(seed, stream, position++)[0];
        token = int32_t((word * uint64_t(shape.vocab_size)) >> 32);
      }
    }
    for (float& logp : s.behaviour_logp) {
      logp = -4.0f * philox_uniform(seed, stream, position++);  // a log-prob in (-4, 0]
    }
  }
  return batch;
}

}  // namespace rlf
