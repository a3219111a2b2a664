#include "src/model/generation.h"

#include <chrono>
#include <stdexcept>
#include <string>

#include "kernels/arena.h"
#include "kernels/sampling.h"
#if defined(RLFUSION_HAVE_CUDA)
#include "kernels/cuda/cuda_ops.h"
#endif

namespace rlf {

namespace {

// Logits of the last token of each listed sequence, recomputed from its whole prefix.
const float* recompute_last_logits(Transformer<float>& model, KVCache<float>& scratch_cache,
                                   const std::vector<std::vector<int>>& sequences,
                                   const std::vector<int>& rows) {
  std::vector<int> tokens, offsets{0}, slots;
  for (int r : rows) {
    tokens.insert(tokens.end(), sequences[size_t(r)].begin(), sequences[size_t(r)].end());
    offsets.push_back(int(tokens.size()));
    slots.push_back(int(slots.size()));
  }
  return model.prefill(scratch_cache, tokens.data(), offsets.data(), int(rows.size()),
                       slots.data());
}

}  // namespace

void sample_next_tokens(Transformer<float>& model, int* tokens, float* logp, const float* logits,
                        const int64_t* sample_ids, const int* positions, int B,
                        const GenerationSettings& s) {
  const int V = model.config().vocab_size;
  if (model.ops().backend == Backend::Reference) {
    ref::sample_tokens(tokens, logp, logits, sample_ids, positions, B, V, s.seed, s.temperature,
                       s.top_p);
#if defined(RLFUSION_HAVE_CUDA)
  } else if (model.ops().backend == Backend::Cuda) {
    cuda::sample_tokens(tokens, logp, logits, sample_ids, positions, B, V, s.seed, s.temperature,
                        s.top_p, model.device());
#endif
  } else {
    cpu::sample_tokens(tokens, logp, logits, sample_ids, positions, B, V, s.seed, s.temperature,
                       s.top_p, model.device());
  }
}

int generation_length(const Transformer<float>& model, int longest_prompt,
                      const GenerationSettings& settings, const char* caller) {
  const int max_len = longest_prompt + settings.max_new_tokens;
  if (max_len > model.config().max_seq_len) {
    throw std::invalid_argument(
        std::string(caller) + ": prompt + max_new_tokens = " + std::to_string(max_len) +
        " exceeds the model's max_seq_len " + std::to_string(model.config().max_seq_len));
  }
  return max_len;
}

std::vector<GeneratedSample> generate(Transformer<float>& model,
                                      const std::vector<std::vector<int>>& prompts,
                                      const std::vector<int64_t>& sample_ids,
                                      const GenerationSettings& settings,
                                      BatchOccupancy* occupancy) {
  const int B = int(prompts.size());
  if (sample_ids.size() != prompts.size()) {
    throw std::invalid_argument("generate: one sample id per prompt is required");
  }
  std::vector<GeneratedSample> out(static_cast<size_t>(B));
  // With expert parallelism every prefill and decode step is collective over the EP group, so a
  // rank with nothing to generate still takes part with zero rows.
  if (B == 0 && !model.expert_parallel()) return out;
  int longest = 0;
  for (const auto& p : prompts) {
    if (p.empty()) throw std::invalid_argument("generate: empty prompt");
    longest = std::max(longest, int(p.size()));
  }
  const int max_len = generation_length(model, longest, settings, "generate");
  Arena& device = model.device();
  ArenaScope scope(device);
  KVCache<float> cache = model.allocate_kv_cache(B, max_len);
  const Arena::Mark after_cache = device.mark();
  if (occupancy) occupancy->capacity = std::max(occupancy->capacity, B);
  auto step_began = std::chrono::steady_clock::now();

  std::vector<std::vector<int>> sequences = prompts;
  std::vector<int> active(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) active[size_t(b)] = b;

  // Step 0: prefill every prompt, then sample the first response token of each.
  const float* logits;
  {
    std::vector<int> tokens, offsets{0};
    for (const auto& p : prompts) {
      tokens.insert(tokens.end(), p.begin(), p.end());
      offsets.push_back(int(tokens.size()));
    }
    logits = model.prefill(cache, tokens.data(), offsets.data(), B, active.data());
  }
  std::vector<int> next(static_cast<size_t>(B)), positions(static_cast<size_t>(B)),
      step_tokens(static_cast<size_t>(B));
  std::vector<int64_t> ids(static_cast<size_t>(B));
  std::vector<float> logp(static_cast<size_t>(B));
  for (int step = 0;; ++step) {
    const int A = int(active.size());
    for (int i = 0; i < A; ++i) {
      const int b = active[size_t(i)];
      ids[size_t(i)] = sample_ids[size_t(b)];
      positions[size_t(i)] = int(sequences[size_t(b)].size());  // position of the new token
    }
    {
      ArenaScope sampling_scope(device);
      sample_next_tokens(model, next.data(), logp.data(), logits, ids.data(), positions.data(), A,
                         settings);
    }
    std::vector<int> still_active;
    for (int i = 0; i < A; ++i) {
      const int b = active[size_t(i)];
      GeneratedSample& sample = out[size_t(b)];
      sample.tokens.push_back(next[size_t(i)]);
      sample.logprobs.push_back(logp[size_t(i)]);
      sequences[size_t(b)].push_back(next[size_t(i)]);
      if (next[size_t(i)] == settings.eos_token) {
        sample.ended = true;
      } else if (int(sample.tokens.size()) < settings.max_new_tokens) {
        still_active.push_back(b);
      }
    }
    active.swap(still_active);
    if (occupancy) {
      // A step: its prefill or decode and its sampling.
      const auto now = std::chrono::steady_clock::now();
      occupancy->add_step(A, std::chrono::duration<double>(now - step_began).count());
      step_began = now;
    }
    if (!model.on_any_expert_parallel_rank(!active.empty())) break;
    // The previous step's logits are consumed: rewind to just after the cache.
    device.release(after_cache);
    const int A2 = int(active.size());
    if (settings.use_kv_cache) {
      for (int i = 0; i < A2; ++i) {
        const int b = active[size_t(i)];
        step_tokens[size_t(i)] = sequences[size_t(b)].back();
        positions[size_t(i)] = int(sequences[size_t(b)].size()) - 1;
      }
      logits = model.decode(cache, step_tokens.data(), active.data(), positions.data(), A2);
    } else {
      logits = recompute_last_logits(model, cache, sequences, active);
    }
  }
  return out;
}

}  // namespace rlf
