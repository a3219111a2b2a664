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

RolloutPool::Phase::Phase(RolloutPool& pool, int version, const PoolSettings& settings)
    : pool_(pool), version_(version), settings_(settings) {
  check_settings(settings);
  waiting_ = pool.phase_order();
  stats_.phase_samples = int(waiting_.size());
  for (const Sequence& s : waiting_) {
    counted_samples_ += s.prompt_id < settings.count_prompts_below;
    longest_prompt_ = std::max(longest_prompt_, int(pool.member(s).rollout.prompt.size()));
  }
  for (const auto& [prompt_id, group] : pool.groups_) {
    for (const Member& m : group) {
      if (!m.rollout.response.empty() && m.rollout.version_min < settings.finish_older_than) {
        last_phase_.insert(prompt_id);
      }
    }
  }
  slots_ =
      settings.slots == 0 ? stats_.phase_samples : std::min(settings.slots, stats_.phase_samples);
  for (int s = slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  stats_.occupancy.capacity = slots_;
  step_began_ = std::chrono::steady_clock::now();
}

RolloutPool::Phase::Step RolloutPool::Phase::begin_step() {
  admitted_.clear();
  next_waiting_before_ = next_waiting_;
  free_slots_before_ = free_slots_;
  counters_before_ = pool_.counters_;
  while (!stopped_ && !free_slots_.empty() && next_waiting_ < waiting_.size()) {
    admitted_.push_back(waiting_[next_waiting_++]);
    admitted_.back().slot = free_slots_.back();
    free_slots_.pop_back();
  }
  Step step;
  for (const Sequence& s : decoding_) {
    const Rollout& r = pool_.member(s).rollout;
    step.decode_tokens.push_back(r.response.back());
    step.decode_slots.push_back(s.slot);
    step.decode_positions.push_back(int(r.prompt.size() + r.response.size()) - 1);
  }
  for (const Sequence& s : admitted_) {
    const Rollout& r = pool_.member(s).rollout;
    step.prefill_tokens.insert(step.prefill_tokens.end(), r.prompt.begin(), r.prompt.end());
    step.prefill_tokens.insert(step.prefill_tokens.end(), r.response.begin(), r.response.end());
    step.prefill_offsets.push_back(int(step.prefill_tokens.size()));
    step.prefill_slots.push_back(s.slot);
    if (!r.response.empty()) {
      ++pool_.counters_.resumed_samples;
      pool_.counters_.recomputed_prefix_tokens += int64_t(r.prompt.size() + r.response.size());
    }
  }
  // (Not undone by undo_begin_step: a pipeline still runs the undone step through its stages.)
  stats_.steps_begun += 1;
  stats_.decode_rows += step.decode_rows();
  stats_.prefill_sequences += step.prefill_rows();
  stats_.prefill_tokens += int64_t(step.prefill_tokens.size());
  return step;
}

void RolloutPool::Phase::undo_begin_step() {
  admitted_.clear();
  next_waiting_ = next_waiting_before_;
  free_slots_ = free_slots_before_;
  pool_.counters_ = counters_before_;
}

bool RolloutPool::Phase::end_step(Transformer<float>& model, const GenerationSettings& sampling,
                                  const float* decode_logits, const float* prefill_logits) {
  int finished = 0;
  if (!decoding_.empty()) {
    finished += pool_.append_tokens(model, sampling, version_, decode_logits, decoding_);
  }
  if (!admitted_.empty()) {
    finished += pool_.append_tokens(model, sampling, version_, prefill_logits, admitted_);
  }
  const int64_t rows = int64_t(decoding_.size() + admitted_.size());
  stats_.generated_tokens += rows;
  if (rows > 0) ++stats_.steps;
  {
    // After this rank's cut, EP steps with zero rows are all bubble.
    const auto now = std::chrono::steady_clock::now();
    stats_.occupancy.add_step(int(rows), std::chrono::duration<double>(now - step_began_).count());
    step_began_ = now;
  }
  stats_.finished += finished;
  decoding_.insert(decoding_.end(), admitted_.begin(), admitted_.end());
  admitted_.clear();
  for (const Sequence& s : decoding_) {
    counted_finished_ += pool_.member(s).finished && s.prompt_id < settings_.count_prompts_below;
  }
  pool_.release_finished(decoding_, free_slots_);
  const bool all_done = decoding_.empty() && next_waiting_ == waiting_.size();
  const auto last_chance = [&](const Sequence& s) { return last_phase_.count(s.prompt_id) > 0; };
  // (partials are admitted first, so one still waiting for a slot is rare but possible)
  const bool last_chance_decoding =
      std::any_of(decoding_.begin(), decoding_.end(), last_chance) ||
      std::any_of(waiting_.begin() + ptrdiff_t(next_waiting_), waiting_.end(), last_chance);
  const bool threshold_reached =
      double(counted_finished_) >= settings_.finish_threshold * double(counted_samples_) &&
      !last_chance_decoding;
  return all_done || threshold_reached;
}

void RolloutPool::Phase::settle(bool ready) {
  if (stopped_ || !ready) return;
  stopped_ = true;
  stats_.cut = int(decoding_.size());
  pool_.counters_.cut_samples += stats_.cut;
  decoding_.clear();
}

PhaseStats RolloutPool::generate_phase(Transformer<float>& model,
                                       const GenerationSettings& sampling, int version,
                                       const PoolSettings& settings) {
  Phase phase(*this, version, settings);
  // With expert parallelism every prefill and decode step is collective over the EP group, and
  // with all_ranks_ready every step's agreement is collective: a rank with nothing to generate
  // still takes part, with zero rows.
  if (phase.samples() == 0 && !model.expert_parallel() && !settings.all_ranks_ready) {
    return phase.stats();
  }
  const int max_len =
      generation_length(model, phase.longest_prompt(), sampling, "RolloutPool::generate_phase");
  Arena& device = model.device();
  ArenaScope scope(device);
  KVCache<float> cache = model.allocate_kv_cache(phase.slots(), max_len);
  const Arena::Mark after_cache = device.mark();
  const bool skip_empty = !model.expert_parallel();
  for (int step = 0;; ++step) {
    Phase::Step rows = phase.begin_step();
    // Step 0 has nothing to decode on any rank; later steps decode on every EP rank.
    const float* decode_logits = nullptr;
    if (step > 0 && !(skip_empty && rows.decode_rows() == 0)) {
      decode_logits = model.decode(cache, rows.decode_tokens.data(), rows.decode_slots.data(),
                                   rows.decode_positions.data(), rows.decode_rows());
    }
    const float* prefill_logits = nullptr;
    if (!(skip_empty && rows.prefill_rows() == 0)) {
      prefill_logits = model.prefill(cache, rows.prefill_tokens.data(), rows.prefill_offsets.data(),
                                     rows.prefill_rows(), rows.prefill_slots.data());
    }
    bool ready = phase.end_step(model, sampling, decode_logits, prefill_logits);
    if (settings.all_ranks_ready && !phase.stopped()) ready = settings.all_ranks_ready(ready);
    phase.settle(ready);
    if (!model.on_any_expert_parallel_rank(!phase.stopped())) break;
    // The step's logits are consumed: rewind to just after the cache.
    device.release(after_cache);
  }
  return phase.stats();
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
