// Batched autoregressive generation with a KV cache: prompts are prefilled together, then every
// decode step runs only the unfinished sequences (finished ones leave the batch). Tokens are
// drawn by the counter-based sampler keyed by (seed, sample id, position), so a sample's tokens
// do not depend on which other samples share its batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "src/model/transformer.h"

namespace rlf {

struct GenerationSettings {
  int max_new_tokens = 32;
  int eos_token = -1;  // < 0: no end-of-sequence token, generate max_new_tokens
  float temperature = 1.0f;
  float top_p = 1.0f;
  uint64_t seed = 0;
  bool use_kv_cache = true;  // false: recompute the whole prefix every step (benchmark baseline)
};

struct GeneratedSample {
  std::vector<int> tokens;      // response tokens (including the end token if one was drawn)
  std::vector<float> logprobs;  // behaviour log-prob of each response token
  bool ended = false;           // stopped at eos_token rather than at max_new_tokens
};

// How full a generator's batch was, step by step: the long-tail bubble. A step that runs `rows`
// of `capacity` rows leaves (capacity - rows) / capacity of the device unused for its wall time.
// On an accelerator a step costs about the same at any row count, so that share is idle time;
// on a CPU a step's cost grows with its rows, so the same share overstates the time lost less.
struct BatchOccupancy {
  int capacity = 0;  // rows a step can run: the batch, or the pool's slots
  int steps = 0;
  int64_t rows = 0;           // rows run, over all steps
  double seconds = 0;         // wall time of the steps
  double bubble_seconds = 0;  // sum over steps of wall time x unused share
  // Generation inside a pipeline: the decode steps of its groups that this rank, the last stage,
  // started (one next-token message each; a group's steps follow its longest sample).
  int64_t group_decode_steps = 0;

  void add_step(int step_rows, double step_seconds) {
    steps += 1;
    rows += step_rows;
    seconds += step_seconds;
    if (capacity > 0) bubble_seconds += step_seconds * double(capacity - step_rows) / capacity;
  }
  void add(const BatchOccupancy& o) {
    capacity = std::max(capacity, o.capacity);
    steps += o.steps;
    rows += o.rows;
    seconds += o.seconds;
    bubble_seconds += o.bubble_seconds;
    group_decode_steps += o.group_decode_steps;
  }
};

// One token for each of B rows of logits [B, V] on the model's backend: tokens[b] and its
// log-prob logp[b], drawn from the stream of (settings.seed, sample_ids[b], positions[b]).
void sample_next_tokens(Transformer<float>& model, int* tokens, float* logp, const float* logits,
                        const int64_t* sample_ids, const int* positions, int B,
                        const GenerationSettings& settings);

// The KV cache length for prompts up to `longest_prompt` tokens plus settings.max_new_tokens;
// std::invalid_argument (prefixed by `caller`) when that exceeds the model's max_seq_len.
int generation_length(const Transformer<float>& model, int longest_prompt,
                      const GenerationSettings& settings, const char* caller);

// With expert parallelism (Transformer::set_expert_parallel) the call is collective over the EP
// group: every rank steps until the last sequence of the group has finished. `occupancy`, when
// given, gets every step's rows and wall time (capacity: the batch).
std::vector<GeneratedSample> generate(Transformer<float>& model,
                                      const std::vector<std::vector<int>>& prompts,
                                      const std::vector<int64_t>& sample_ids,
                                      const GenerationSettings& settings,
                                      BatchOccupancy* occupancy = nullptr);

}  // namespace rlf
