#include "src/rl/rollout_pool.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <stdexcept>
#include <string>

#include "kernels/arena.h"

namespace rlf {

RolloutPool::RolloutPool(const Task& task, int group_size, AdvantageEstimator estimator)
    : task_(task), group_size_(group_size), estimator_(estimator) {
  if (group_size < 2) {
    throw std::invalid_argument("RolloutPool: group_size must be >= 2, got " +
                                std::to_string(group_size));
  }
}

void RolloutPool::add_prompts(int64_t first_prompt, int prompts) {
  for (int64_t p = first_prompt; p < first_prompt + prompts; ++p) {
    Group group(static_cast<size_t>(group_size_));
    for (int g = 0; g < group_size_; ++g) {
      Rollout& r = group[size_t(g)].rollout;
      r.sample_id = p * group_size_ + g;
      r.task_sample = task_.train_sample(p);
      r.prompt = prompt_tokens(r.task_sample);
    }
    if (!groups_.emplace(p, std::move(group)).second) {
      throw std::invalid_argument("RolloutPool::add_prompts: prompt " + std::to_string(p) +
                                  " is already in the pool");
    }
  }
}

std::vector<InFlightSample> RolloutPool::saved_samples() const {
  std::vector<InFlightSample> saved;
  for (const auto& [prompt_id, members] : groups_) {
    for (size_t g = 0; g < members.size(); ++g) {
      const Rollout& r = members[g].rollout;
      saved.push_back({prompt_id, int32_t(g), members[g].finished, r.version_min, r.version_max,
                       std::vector<int32_t>(r.response.begin(), r.response.end()),
                       r.behaviour_logp});
    }
  }
  return saved;
}

void RolloutPool::restore(const std::vector<InFlightSample>& samples) {
  if (!groups_.empty()) throw std::invalid_argument("RolloutPool::restore: the pool is not empty");
  if (samples.size() % size_t(group_size_) != 0) {
    throw std::invalid_argument("RolloutPool::restore: samples do not form whole groups");
  }
  for (size_t at = 0; at < samples.size(); at += size_t(group_size_)) {
    const int64_t prompt_id = samples[at].prompt_id;
    add_prompts(prompt_id, 1);
    Group& group = groups_.at(prompt_id);
    for (int g = 0; g < group_size_; ++g) {
      const InFlightSample& s = samples[at + size_t(g)];
      if (s.prompt_id != prompt_id || s.member != g ||
          s.response.size() != s.behaviour_logp.size()) {
        throw std::invalid_argument("RolloutPool::restore: sample " + std::to_string(at + g) +
                                    " is not member " + std::to_string(g) + " of prompt " +
                                    std::to_string(prompt_id));
      }
      Member& m = group[size_t(g)];
      m.finished = s.finished;
      m.rollout.response.assign(s.response.begin(), s.response.end());
      m.rollout.behaviour_logp = s.behaviour_logp;
      m.rollout.version_min = s.version_min;
      m.rollout.version_max = s.version_max;
    }
  }
}

void RolloutPool::restart(Member& m) {
  ++counters_.regenerated_samples;
  counters_.discarded_tokens += int64_t(m.rollout.response.size());
  m.rollout.response.clear();
  m.rollout.behaviour_logp.clear();
  m.finished = false;
}

void RolloutPool::enforce_staleness(int min_version, StalePolicy policy) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& members = it->second;
    auto stale = [&](const Member& m) {
      return !m.rollout.response.empty() && m.rollout.version_min < min_version;
    };
    if (std::none_of(members.begin(), members.end(), stale)) {
      ++it;
      continue;
    }
    if (policy == StalePolicy::Drop) {
      ++counters_.dropped_groups;
      counters_.dropped_samples += group_size_;
      it = groups_.erase(it);
      continue;
    }
    for (Member& m : members) {
      if (stale(m)) restart(m);
    }
    ++it;
  }
}

std::vector<RolloutPool::Sequence> RolloutPool::phase_order() const {
  std::vector<Sequence> partial, fresh;
  for (const auto& [prompt_id, group] : groups_) {
    for (int g = 0; g < group_size_; ++g) {
      const Member& m = group[size_t(g)];
      if (m.finished) continue;
      (m.rollout.response.empty() ? fresh : partial).push_back({prompt_id, g, -1});
    }
  }
  partial.insert(partial.end(), fresh.begin(), fresh.end());
  return partial;
}

namespace {

void check_settings(const PoolSettings& settings) {
  if (settings.slots < 0) {
    throw std::invalid_argument("RolloutPool: slots must be >= 0 (0: all), got " +
                                std::to_string(settings.slots));
  }
  if (!(settings.finish_threshold > 0.0 && settings.finish_threshold <= 1.0)) {
    throw std::invalid_argument("RolloutPool: finish_threshold must be in (0, 1], got " +
                                std::to_string(settings.finish_threshold));
  }
}

}  // namespace

const float* RolloutPool::prefill(Transformer<float>& model, KVCache<float>& cache,
                                  const std::vector<Sequence>& sequences) {
  std::vector<int> tokens, offsets{0}, slots;
  for (const Sequence& s : sequences) {
    const Rollout& r = member(s).rollout;
    tokens.insert(tokens.end(), r.prompt.begin(), r.prompt.end());
    tokens.insert(tokens.end(), r.response.begin(), r.response.end());
    offsets.push_back(int(tokens.size()));
    slots.push_back(s.slot);
    if (!r.response.empty()) {
      ++counters_.resumed_samples;
      counters_.recomputed_prefix_tokens += int64_t(r.prompt.size() + r.response.size());
    }
  }
  return model.prefill(cache, tokens.data(), offsets.data(), int(sequences.size()), slots.data());
}

const float* RolloutPool::decode(Transformer<float>& model, KVCache<float>& cache,
                                 const std::vector<Sequence>& sequences) {
  std::vector<int> tokens, slots, positions;
  for (const Sequence& s : sequences) {
    const Rollout& r = member(s).rollout;
    tokens.push_back(r.response.back());
    slots.push_back(s.slot);
    positions.push_back(int(r.prompt.size() + r.response.size()) - 1);
  }
  return model.decode(cache, tokens.data(), slots.data(), positions.data(), int(sequences.size()));
}

int RolloutPool::append_tokens(Transformer<float>& model, const GenerationSettings& sampling,
                               int version, const float* logits,
                               const std::vector<Sequence>& sequences) {
  const size_t B = sequences.size();
  std::vector<int64_t> ids(B);
  std::vector<int> positions(B), next(B);
  std::vector<float> logp(B);
  for (size_t i = 0; i < B; ++i) {
    const Rollout& r = member(sequences[i]).rollout;
    ids[i] = r.sample_id;
    positions[i] = int(r.prompt.size() + r.response.size());
  }
  {
    ArenaScope sampling_scope(model.device());
    sample_next_tokens(model, next.data(), logp.data(), logits, ids.data(), positions.data(),
                       int(B), sampling);
  }
  int finished = 0;
  for (size_t i = 0; i < B; ++i) {
    Member& m = member(sequences[i]);
    Rollout& r = m.rollout;
    if (r.response.empty()) r.version_min = version;
    r.version_max = version;
    r.response.push_back(next[i]);
    r.behaviour_logp.push_back(logp[i]);
    m.finished = next[i] == sampling.eos_token || int(r.response.size()) >= sampling.max_new_tokens;
    finished += m.finished;
  }
  counters_.generated_tokens += int64_t(B);
  return finished;
}

void RolloutPool::release_finished(std::vector<Sequence>& decoding, std::vector<int>& free_slots) {
  std::vector<Sequence> still_decoding;
  for (const Sequence& s : decoding) {
    if (member(s).finished) {
      free_slots.push_back(s.slot);
    } else {
      still_decoding.push_back(s);
    }
  }
  // Freed slots go back lowest first whatever order the sequences finished in.
  std::sort(free_slots.rbegin(), free_slots.rend());
  decoding.swap(still_decoding);
}

PhaseStats RolloutPool::generate_phase(Transformer<float>& model,
                                       const GenerationSettings& sampling, int version,
                                       const PoolSettings& settings) {
  check_settings(settings);
  const std::vector<Sequence> waiting = phase_order();
  PhaseStats stats;
  stats.phase_samples = int(waiting.size());
  const auto counted = [&](const Sequence& s) {
    return s.prompt_id < settings.count_prompts_below;
  };
  const int64_t counted_samples = std::count_if(waiting.begin(), waiting.end(), counted);
  int64_t counted_finished = 0;
  std::set<int64_t> last_phase;  // groups on their last chance (settings.finish_older_than)
  for (const auto& [prompt_id, group] : groups_) {
    for (const Member& m : group) {
      if (!m.rollout.response.empty() && m.rollout.version_min < settings.finish_older_than) {
        last_phase.insert(prompt_id);
      }
    }
  }
  // With expert parallelism every prefill and decode step is collective over the EP group, and
  // with all_ranks_ready every step's agreement is collective: a rank with nothing to generate
  // still takes part, with zero rows.
  if (waiting.empty() && !model.expert_parallel() && !settings.all_ranks_ready) return stats;
  const int slots =
      settings.slots == 0 ? stats.phase_samples : std::min(settings.slots, stats.phase_samples);
  int longest = 0;
  for (const Sequence& s : waiting) {
    longest = std::max(longest, int(member(s).rollout.prompt.size()));
  }
  const int max_len = generation_length(model, longest, sampling, "RolloutPool::generate_phase");
  Arena& device = model.device();
  ArenaScope scope(device);
  KVCache<float> cache = model.allocate_kv_cache(slots, max_len);
  const Arena::Mark after_cache = device.mark();

  std::vector<int> free_slots;  // lowest slot last, so slots are reused lowest first
  for (int s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  stats.occupancy.capacity = slots;
  auto step_began = std::chrono::steady_clock::now();
  size_t next_waiting = 0;
  std::vector<Sequence> decoding;  // in phase order: admission preserves it
  bool stopped = false;
  const bool skip_empty = !model.expert_parallel();
  for (int step = 0;; ++step) {
    std::vector<Sequence> admitted;
    while (!stopped && !free_slots.empty() && next_waiting < waiting.size()) {
      admitted.push_back(waiting[next_waiting++]);
      admitted.back().slot = free_slots.back();
      free_slots.pop_back();
    }
    // Step 0 has nothing to decode on any rank; later steps decode on every EP rank.
    const float* decode_logits = nullptr;
    if (step > 0 && !(skip_empty && decoding.empty())) {
      decode_logits = decode(model, cache, decoding);
    }
    const float* prefill_logits = nullptr;
    if (!(skip_empty && admitted.empty())) prefill_logits = prefill(model, cache, admitted);
    int finished = 0;
    if (!decoding.empty()) {
      finished += append_tokens(model, sampling, version, decode_logits, decoding);
    }
    if (!admitted.empty()) {
      finished += append_tokens(model, sampling, version, prefill_logits, admitted);
    }
    const int64_t rows = int64_t(decoding.size() + admitted.size());
    stats.generated_tokens += rows;
    if (rows > 0) ++stats.steps;
    {
      // After this rank's cut, EP steps with zero rows are all bubble.
      const auto now = std::chrono::steady_clock::now();
      stats.occupancy.add_step(int(rows), std::chrono::duration<double>(now - step_began).count());
      step_began = now;
    }
    stats.finished += finished;
    decoding.insert(decoding.end(), admitted.begin(), admitted.end());
    for (const Sequence& s : decoding) counted_finished += member(s).finished && counted(s);
    release_finished(decoding, free_slots);
    const bool all_done = decoding.empty() && next_waiting == waiting.size();
    const auto last_chance = [&](const Sequence& s) { return last_phase.count(s.prompt_id) > 0; };
    // (partials are admitted first, so one still waiting for a slot is rare but possible)
    const bool last_chance_decoding =
        std::any_of(decoding.begin(), decoding.end(), last_chance) ||
        std::any_of(waiting.begin() + ptrdiff_t(next_waiting), waiting.end(), last_chance);
    const bool threshold_reached =
        double(counted_finished) >= settings.finish_threshold * double(counted_samples) &&
        !last_chance_decoding;
    bool ready = all_done || threshold_reached;
    if (settings.all_ranks_ready && !stopped) ready = settings.all_ranks_ready(ready);
    if (!stopped && ready) {
      stopped = true;
      stats.cut = int(decoding.size());
      counters_.cut_samples += stats.cut;
      decoding.clear();
    }
    if (!model.on_any_expert_parallel_rank(!stopped)) break;
    // The step's logits are consumed: rewind to just after the cache.
    device.release(after_cache);
  }
  return stats;
}

std::vector<Rollout> RolloutPool::take_complete_groups() {
  std::vector<Rollout> rollouts;
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& group = it->second;
    if (!std::all_of(group.begin(), group.end(), [](const Member& m) { return m.finished; })) {
      ++it;
      continue;
    }
    for (Member& m : group) rollouts.push_back(std::move(m.rollout));
    it = groups_.erase(it);
  }
  score_rollouts(task_, group_size_, estimator_, rollouts, learned_);
  return rollouts;
}

size_t RolloutPool::in_flight_samples() const {
  return groups_.size() * size_t(group_size_);
}

}  // namespace rlf
