// StaleSync's rollout pool against the synchronous path: one uncut phase is generate_rollouts;
// continuous batching changes no token; a cut resumes under new weights with the new policy's
// log-probs; stale samples are regenerated or dropped; every sample comes out once, in groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "kernels/arena.h"
#include "src/model/transformer.h"
#include "src/rl/policy_loss.h"
#include "src/rl/rollout.h"
#include "src/rl/rollout_pool.h"
#include "src/rl/tokenizer.h"
#include "tests/test_util.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

constexpr int kGroup = 4;

// "<d><d>=" prompts; the reward grows with the response length, so a random policy's groups
// have distinct rewards and nonzero advantages.
class LengthTask : public Task {
 public:
  std::string name() const override { return "length"; }
  TaskSample sample(int64_t id) const override {
    return {id, std::to_string(id % 10) + std::to_string((id / 10) % 10) + "=", "0"};
  }
  double reward(const TaskSample&, std::string_view response) const override {
    return std::min(1.0, double(response.size()) / 10.0);
  }
  int max_prompt_chars() const override { return 3; }
  int max_response_chars() const override { return 16; }
};

GenerationSettings sampling() {
  GenerationSettings s;
  s.eos_token = Tokenizer::kEos;
  s.max_new_tokens = 16;
  s.seed = 17;
  return s;
}

struct Policy {
  Arena device{"test", 64 << 20};
  Transformer<float> model;
  explicit Policy(uint64_t seed, const Ops<float>& ops = cpu_ops())
      : model(test::tiny_policy_config(), ops, device, false) {
    model.initialize(seed);
  }

  // New weights for the next policy version: every parameter moved a little.
  void perturb(uint64_t seed) {
    const auto noise = test::random_vector<float>(size_t(model.parameter_count()), seed, -0.1, 0.1);
    for (size_t i = 0; i < noise.size(); ++i) model.parameters()[i] += noise[i];
  }
};

PoolSettings pool_settings(int slots, double threshold) {
  PoolSettings p;
  p.slots = slots;
  p.finish_threshold = threshold;
  return p;
}

void expect_same_rollout(const Rollout& got, const Rollout& want) {
  SCOPED_TRACE("sample " + std::to_string(want.sample_id));
  EXPECT_EQ(got.sample_id, want.sample_id);
  EXPECT_EQ(got.prompt, want.prompt);
  EXPECT_EQ(got.response, want.response);
  EXPECT_EQ(got.behaviour_logp, want.behaviour_logp);
  EXPECT_EQ(got.reward, want.reward);
  EXPECT_EQ(got.advantage, want.advantage);
  EXPECT_EQ(got.version_min, want.version_min);
  EXPECT_EQ(got.version_max, want.version_max);
}

TEST(RolloutPool, OneUncutPhaseIsGenerateRollouts) {
  Policy policy(3);
  LengthTask task;
  const auto want =
      generate_rollouts(policy.model, task, 5, 4, kGroup, sampling(), 2, AdvantageEstimator::Grpo);
  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(5, 4);
  const PhaseStats stats = pool.generate_phase(policy.model, sampling(), 2, pool_settings(0, 1.0));
  EXPECT_EQ(stats.phase_samples, 16);
  EXPECT_EQ(stats.finished, 16);
  EXPECT_EQ(stats.cut, 0);
  const auto got = pool.take_complete_groups();
  ASSERT_EQ(got.size(), want.size());
  int64_t tokens = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    expect_same_rollout(got[i], want[i]);
    tokens += int64_t(want[i].response.size());
  }
  EXPECT_EQ(stats.generated_tokens, tokens);
  EXPECT_EQ(pool.counters().generated_tokens, tokens);
  EXPECT_EQ(pool.in_flight_samples(), 0u);
}

// Tokens and log-probs of one response against another's. Bitwise on the reference backend; on
// the CPU backend a row's logits depend on how many rows share its matmul (Eigen takes a GEMV
// for one row and shape-dependent GEMM kernels otherwise), so log-probs differ in the last bits
// between batch shapes, while tokens agree unless a draw falls within that rounding of a
// boundary.
void expect_same_draws(const Rollout& got, const Rollout& want, bool bitwise) {
  SCOPED_TRACE("sample " + std::to_string(want.sample_id));
  EXPECT_EQ(got.sample_id, want.sample_id);
  EXPECT_EQ(got.response, want.response);
  if (bitwise) {
    EXPECT_EQ(got.behaviour_logp, want.behaviour_logp);
  } else if (got.response == want.response) {
    test::expect_close(got.behaviour_logp, want.behaviour_logp, "log-probs", 1e-5, 1e-5);
  }
}

// The sampler is keyed by (sample id, position), so a slot limit changes when a sample decodes,
// never what it draws.
TEST(RolloutPool, ContinuousBatchingDrawsTheSameTokens) {
  for (const bool reference : {true, false}) {
    SCOPED_TRACE(reference ? "reference backend" : "cpu backend");
    Policy policy(4, reference ? reference_ops<float>() : cpu_ops());
    LengthTask task;
    const auto want = generate_rollouts(policy.model, task, 0, 4, kGroup, sampling(), 0,
                                        AdvantageEstimator::Rloo);
    for (int slots : {1, 3, 7}) {
      SCOPED_TRACE("slots " + std::to_string(slots));
      RolloutPool pool(task, kGroup, AdvantageEstimator::Rloo);
      pool.add_prompts(0, 4);
      const PhaseStats stats =
          pool.generate_phase(policy.model, sampling(), 0, pool_settings(slots, 1.0));
      EXPECT_EQ(stats.finished, 16);
      // At most `slots` rows per step.
      EXPECT_GE(int64_t(stats.steps) * slots, stats.generated_tokens);
      const auto got = pool.take_complete_groups();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        expect_same_draws(got[i], want[i], reference);
        if (got[i].response == want[i].response) {
          EXPECT_EQ(got[i].reward, want[i].reward);
        }
      }
    }
  }
}

// Response lengths of the uncut run decide the cut: with every sample decoding from step 0,
// sample i finishes at step length_i - 1.
int expected_cut_step(const std::vector<Rollout>& uncut, double threshold) {
  std::vector<int> finish_step;
  for (const Rollout& r : uncut) finish_step.push_back(int(r.response.size()) - 1);
  std::sort(finish_step.begin(), finish_step.end());
  for (size_t k = 1; k <= finish_step.size(); ++k) {
    if (double(k) >= threshold * double(finish_step.size())) return finish_step[k - 1];
  }
  return finish_step.back();
}

std::vector<const Rollout*> pointers(const std::vector<Rollout>& rollouts) {
  std::vector<const Rollout*> out;
  for (const Rollout& r : rollouts) out.push_back(&r);
  return out;
}

TEST(RolloutPool, CutSamplesResumeUnderNewWeights) {
  Policy policy(5);
  LengthTask task;
  const double threshold = 0.25;
  const auto uncut =
      generate_rollouts(policy.model, task, 0, 4, kGroup, sampling(), 0, AdvantageEstimator::Grpo);
  const int cut_step = expected_cut_step(uncut, threshold);
  int expected_cut = 0;
  for (const Rollout& r : uncut) expected_cut += int(r.response.size()) - 1 > cut_step;
  ASSERT_GT(expected_cut, 0) << "this seed must leave a long tail to cut";

  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(0, 4);
  const PhaseStats first =
      pool.generate_phase(policy.model, sampling(), 0, pool_settings(0, threshold));
  EXPECT_EQ(first.steps, cut_step + 1);
  EXPECT_EQ(first.cut, expected_cut);
  EXPECT_EQ(first.finished, 16 - expected_cut);
  EXPECT_EQ(pool.counters().cut_samples, expected_cut);

  policy.perturb(99);
  const PhaseStats second = pool.generate_phase(policy.model, sampling(), 1, pool_settings(0, 1.0));
  EXPECT_EQ(second.phase_samples, expected_cut);
  EXPECT_EQ(second.finished, expected_cut);
  EXPECT_EQ(pool.counters().resumed_samples, expected_cut);
  const auto got = pool.take_complete_groups();
  ASSERT_EQ(got.size(), uncut.size());
  const auto teacher_forced = response_logprobs(policy.model, pointers(got), 1.0f);
  int64_t recomputed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("sample " + std::to_string(i));
    const Rollout& r = got[i];
    const bool was_cut = int(uncut[i].response.size()) - 1 > cut_step;
    if (!was_cut) {
      // Identical to the uncut run up to the cut; the advantage moves with its group's rewards.
      expect_same_draws(r, uncut[i], true);
      EXPECT_EQ(r.version_max, 0);
      continue;
    }
    // Tokens before the cut are the old policy's; those after, the new one's.
    const size_t before = size_t(cut_step) + 1;
    recomputed += int64_t(r.prompt.size() + before);
    ASSERT_GT(r.response.size(), before);
    EXPECT_TRUE(std::equal(r.response.begin(), r.response.begin() + long(before),
                           uncut[i].response.begin()));
    EXPECT_TRUE(std::equal(r.behaviour_logp.begin(), r.behaviour_logp.begin() + long(before),
                           uncut[i].behaviour_logp.begin()));
    const std::vector<float> resumed(r.behaviour_logp.begin() + long(before),
                                     r.behaviour_logp.end());
    const std::vector<float> want(teacher_forced[i].begin() + long(before),
                                  teacher_forced[i].end());
    test::expect_close(resumed, want, "resumed tokens' log-probs", 1e-4, 1e-4);
    EXPECT_EQ(r.version_min, 0);
    EXPECT_EQ(r.version_max, 1);
  }
  EXPECT_EQ(pool.counters().recomputed_prefix_tokens, recomputed);
}

// A checkpoint's view of the pool: saved between phases and restored into a fresh pool, the
// phases that follow draw the same tokens, log-probs and versions as the original's.
// A phase taken a step at a time (RolloutPool::Phase, as a pipeline drives it), each step begun,
// undone and begun again (a pipelined lane begins its next step before the ranks agree to end the
// phase): the undone step changes nothing (the same rows again, the counters as before), and the
// phase ends where generate_phase ends, with the same samples, counters and statistics. Partials
// from a cut phase are resumed, in three slots, and the phase is cut again.
TEST(RolloutPool, AStepBegunAndUndoneLeavesThePhaseAsItWas) {
  Policy policy(5);
  LengthTask task;
  RolloutPool original(task, kGroup, AdvantageEstimator::Grpo);
  original.add_prompts(0, 4);
  original.generate_phase(policy.model, sampling(), 0, pool_settings(0, 0.25));
  RolloutPool stepped(task, kGroup, AdvantageEstimator::Grpo);
  stepped.restore(original.saved_samples());
  stepped.add_prompts(4, 2);
  original.add_prompts(4, 2);
  policy.perturb(7);
  const PoolSettings settings = pool_settings(3, 0.5);
  // (A restored pool's counters start at zero: the original's are compared by this phase's part.)
  const PoolCounters earlier = original.counters();
  const PhaseStats want = original.generate_phase(policy.model, sampling(), 1, settings);

  RolloutPool::Phase phase(stepped, 1, settings);
  ASSERT_GT(phase.samples(), 0);
  Arena& device = policy.model.device();
  ArenaScope scope(device);
  KVCache<float> cache = policy.model.allocate_kv_cache(
      phase.slots(), generation_length(policy.model, phase.longest_prompt(), sampling(), "test"));
  const Arena::Mark after_cache = device.mark();
  int resumed = 0;
  while (!phase.stopped()) {
    const PoolCounters before = stepped.counters();
    const RolloutPool::Phase::Step first = phase.begin_step();
    phase.undo_begin_step();
    EXPECT_EQ(stepped.counters().resumed_samples, before.resumed_samples);
    EXPECT_EQ(stepped.counters().recomputed_prefix_tokens, before.recomputed_prefix_tokens);
    RolloutPool::Phase::Step step = phase.begin_step();
    EXPECT_EQ(step.decode_tokens, first.decode_tokens);
    EXPECT_EQ(step.decode_slots, first.decode_slots);
    EXPECT_EQ(step.decode_positions, first.decode_positions);
    EXPECT_EQ(step.prefill_tokens, first.prefill_tokens);
    EXPECT_EQ(step.prefill_offsets, first.prefill_offsets);
    EXPECT_EQ(step.prefill_slots, first.prefill_slots);
    resumed += int(stepped.counters().resumed_samples - before.resumed_samples);
    const float* decode_logits =
        step.decode_rows() > 0
            ? policy.model.decode(cache, step.decode_tokens.data(), step.decode_slots.data(),
                                  step.decode_positions.data(), step.decode_rows())
            : nullptr;
    const float* prefill_logits =
        step.prefill_rows() > 0
            ? policy.model.prefill(cache, step.prefill_tokens.data(), step.prefill_offsets.data(),
                                   step.prefill_rows(), step.prefill_slots.data())
            : nullptr;
    phase.settle(phase.end_step(policy.model, sampling(), decode_logits, prefill_logits));
    device.release(after_cache);
  }
  EXPECT_GT(resumed, 0);
  EXPECT_GT(want.cut, 0);
  EXPECT_EQ(phase.stats().steps, want.steps);
  EXPECT_EQ(phase.stats().finished, want.finished);
  EXPECT_EQ(phase.stats().cut, want.cut);
  EXPECT_EQ(phase.stats().generated_tokens, want.generated_tokens);
  EXPECT_EQ(stepped.saved_samples(), original.saved_samples());
  EXPECT_EQ(stepped.counters().resumed_samples,
            original.counters().resumed_samples - earlier.resumed_samples);
  EXPECT_EQ(stepped.counters().recomputed_prefix_tokens,
            original.counters().recomputed_prefix_tokens - earlier.recomputed_prefix_tokens);
  EXPECT_EQ(stepped.counters().cut_samples, original.counters().cut_samples - earlier.cut_samples);
  EXPECT_EQ(stepped.counters().generated_tokens,
            original.counters().generated_tokens - earlier.generated_tokens);
}

TEST(RolloutPool, ARestoredPoolContinuesExactlyLikeTheSavedOne) {
  Policy policy(5);
  LengthTask task;
  RolloutPool original(task, kGroup, AdvantageEstimator::Grpo);
  original.add_prompts(0, 4);
  original.generate_phase(policy.model, sampling(), 0, pool_settings(0, 0.25));
  original.take_complete_groups();
  const std::vector<InFlightSample> saved = original.saved_samples();
  ASSERT_FALSE(saved.empty());
  int partial = 0;
  for (const InFlightSample& s : saved) partial += !s.finished && !s.response.empty();
  ASSERT_GT(partial, 0) << "the cut must leave partial rollouts in flight";

  RolloutPool restored(task, kGroup, AdvantageEstimator::Grpo);
  restored.restore(saved);
  EXPECT_EQ(restored.saved_samples(), saved);
  EXPECT_EQ(restored.in_flight_samples(), original.in_flight_samples());
  EXPECT_THROW(restored.restore(saved), std::invalid_argument);  // not empty

  policy.perturb(11);
  for (RolloutPool* pool : {&original, &restored}) {
    pool->add_prompts(4, 2);
    pool->generate_phase(policy.model, sampling(), 1, pool_settings(6, 0.5));
  }
  EXPECT_EQ(restored.saved_samples(), original.saved_samples());
  const std::vector<Rollout> want = original.take_complete_groups();
  const std::vector<Rollout> got = restored.take_complete_groups();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("sample " + std::to_string(i));
    expect_same_rollout(got[i], want[i]);
  }

  // Samples that are not whole groups in order are refused.
  RolloutPool broken(task, kGroup, AdvantageEstimator::Grpo);
  std::vector<InFlightSample> shuffled = saved;
  std::swap(shuffled[0], shuffled[1]);
  EXPECT_THROW(broken.restore(shuffled), std::invalid_argument);
  RolloutPool short_pool(task, kGroup, AdvantageEstimator::Grpo);
  EXPECT_THROW(short_pool.restore({saved.begin(), saved.end() - 1}), std::invalid_argument);
}

// A first phase at version 0 cut at a low threshold (every sample started: no slot limit); its
// complete groups taken; every sample left is older than the bound min_version = 1.
struct StaleSetup {
  Policy policy{6};
  LengthTask task;
  RolloutPool pool{task, kGroup, AdvantageEstimator::Grpo};
  std::vector<Rollout> taken;
  std::set<int64_t> stale_prompts;
  int64_t stale_tokens = 0;

  StaleSetup() {
    pool.add_prompts(0, 4);
    pool.generate_phase(policy.model, sampling(), 0, pool_settings(0, 0.25));
    taken = pool.take_complete_groups();
    std::set<int64_t> complete;
    for (const Rollout& r : taken) complete.insert(r.task_sample.id);
    for (int64_t p = 0; p < 4; ++p) {
      if (!complete.count(p)) stale_prompts.insert(p);
    }
    stale_tokens = pool.counters().generated_tokens;
    for (const Rollout& r : taken) stale_tokens -= int64_t(r.response.size());
    policy.perturb(7);
  }
};

TEST(RolloutPool, RegeneratedSamplesStartAgainUnderNewWeights) {
  StaleSetup s;
  ASSERT_FALSE(s.stale_prompts.empty());
  s.pool.enforce_staleness(1, StalePolicy::Regenerate);
  EXPECT_EQ(s.pool.counters().regenerated_samples, int64_t(s.stale_prompts.size()) * kGroup);
  EXPECT_EQ(s.pool.counters().discarded_tokens, s.stale_tokens);
  EXPECT_EQ(s.pool.counters().dropped_groups, 0);
  s.pool.generate_phase(s.policy.model, sampling(), 1, pool_settings(0, 1.0));
  const auto got = s.pool.take_complete_groups();
  ASSERT_EQ(got.size(), s.stale_prompts.size() * kGroup);
  for (const Rollout& r : got) {
    EXPECT_EQ(r.version_min, 1) << r.sample_id;
    EXPECT_EQ(r.version_max, 1) << r.sample_id;
  }
  // Restarted from the prompt, a sample draws what the new policy draws for it from scratch.
  for (int64_t p : s.stale_prompts) {
    const auto want = generate_rollouts(s.policy.model, s.task, p, 1, kGroup, sampling(), 1,
                                        AdvantageEstimator::Grpo);
    for (int g = 0; g < kGroup; ++g) {
      const auto it = std::find_if(got.begin(), got.end(), [&](const Rollout& r) {
        return r.sample_id == want[size_t(g)].sample_id;
      });
      ASSERT_NE(it, got.end());
      expect_same_draws(*it, want[size_t(g)], false);
    }
  }
}

TEST(RolloutPool, DroppedGroupsNeverComeBack) {
  StaleSetup s;
  ASSERT_FALSE(s.stale_prompts.empty());
  s.pool.enforce_staleness(1, StalePolicy::Drop);
  EXPECT_EQ(s.pool.counters().dropped_groups, int64_t(s.stale_prompts.size()));
  EXPECT_EQ(s.pool.counters().dropped_samples, int64_t(s.stale_prompts.size()) * kGroup);
  EXPECT_EQ(s.pool.counters().regenerated_samples, 0);
  EXPECT_EQ(s.pool.in_flight_samples(), 0u);
  const PhaseStats stats =
      s.pool.generate_phase(s.policy.model, sampling(), 1, pool_settings(0, 1.0));
  EXPECT_EQ(stats.phase_samples, 0);
  EXPECT_TRUE(s.pool.take_complete_groups().empty());
}

struct ManyPhases {
  int staleness;
  StalePolicy policy;
};

// Phases at versions 0..7 each add two prompts and cut at a quarter finished with three slots;
// a last uncut phase drains the pool. Staleness 1 resumes partials; staleness 0 regenerates or
// drops every sample that outlives its phase.
void check_many_phases(const ManyPhases& c) {
  SCOPED_TRACE("staleness " + std::to_string(c.staleness) +
               (c.policy == StalePolicy::Drop ? " drop" : " regenerate"));
  Policy policy(8);
  LengthTask task;
  RolloutPool pool(task, kGroup, AdvantageEstimator::Rloo);
  const int phases = 8, prompts_per_phase = 2;
  std::map<int64_t, int> seen;
  std::vector<Rollout> all;
  for (int version = 0; version <= phases; ++version) {
    if (version < phases) {
      pool.add_prompts(int64_t(version) * prompts_per_phase, prompts_per_phase);
    }
    pool.enforce_staleness(version - c.staleness, c.policy);
    const double threshold = version < phases ? 0.25 : 1.0;
    pool.generate_phase(policy.model, sampling(), version, pool_settings(3, threshold));
    for (Rollout& r : pool.take_complete_groups()) {
      EXPECT_GE(r.version_min, version - c.staleness) << r.sample_id;
      EXPECT_LE(r.version_max, version) << r.sample_id;
      ++seen[r.sample_id];
      all.push_back(std::move(r));
    }
    policy.perturb(uint64_t(100 + version));
  }
  const PoolCounters& counters = pool.counters();
  EXPECT_EQ(pool.in_flight_samples(), 0u);
  EXPECT_EQ(int64_t(seen.size()) + counters.dropped_samples,
            int64_t(phases) * prompts_per_phase * kGroup);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "sample " << id;
  // Groups come out whole and consecutive, advantages from their own rewards.
  ASSERT_EQ(all.size() % kGroup, 0u);
  for (size_t first = 0; first < all.size(); first += kGroup) {
    std::vector<double> rewards, advantages(kGroup);
    for (int g = 0; g < kGroup; ++g) {
      const Rollout& r = all[first + size_t(g)];
      EXPECT_EQ(r.sample_id, all[first].sample_id + g);
      EXPECT_EQ(r.reward, task.reward(r.task_sample, Tokenizer::decode(r.response)));
      rewards.push_back(r.reward);
    }
    compute_advantages(rewards.data(), 1, kGroup, AdvantageEstimator::Rloo, 1e-6,
                       advantages.data());
    for (int g = 0; g < kGroup; ++g) {
      EXPECT_EQ(all[first + size_t(g)].advantage, advantages[size_t(g)]);
    }
  }
  EXPECT_GT(counters.cut_samples, 0);
  if (c.staleness > 0) {
    EXPECT_GT(counters.resumed_samples, 0);
  } else if (c.policy == StalePolicy::Regenerate) {
    EXPECT_GT(counters.regenerated_samples, 0);
    EXPECT_EQ(counters.resumed_samples, 0);
  } else {
    EXPECT_GT(counters.dropped_groups, 0);
    EXPECT_EQ(counters.dropped_samples, counters.dropped_groups * kGroup);
  }
}

TEST(RolloutPool, EverySampleComesOutOnceInCompleteGroupsWithinTheBound) {
  check_many_phases({1, StalePolicy::Regenerate});
  check_many_phases({0, StalePolicy::Regenerate});
  check_many_phases({0, StalePolicy::Drop});
}

TEST(RolloutPool, BadSettingsAreRejected) {
  Policy policy(9);
  LengthTask task;
  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(0, 1);
  EXPECT_THROW(pool.add_prompts(0, 1), std::invalid_argument);
  EXPECT_THROW(pool.generate_phase(policy.model, sampling(), 0, pool_settings(-1, 1.0)),
               std::invalid_argument);
  EXPECT_THROW(pool.generate_phase(policy.model, sampling(), 0, pool_settings(0, 0.0)),
               std::invalid_argument);
  EXPECT_THROW(pool.generate_phase(policy.model, sampling(), 0, pool_settings(0, 1.5)),
               std::invalid_argument);
  EXPECT_THROW(RolloutPool(task, 1, AdvantageEstimator::Grpo), std::invalid_argument);
}

// Lookahead: the next step's prompts fill freed slots but do not count towards the threshold;
// and a partial on its last chance (older than finish_older_than) holds the phase open.
TEST(RolloutPool, LookaheadFillsFreedSlotsAndLastChancePartialsFinishFirst) {
  Policy policy(31);
  LengthTask task;
  RolloutPool pool(task, kGroup, AdvantageEstimator::Grpo);
  pool.add_prompts(0, 4);  // this step's work: prompts 0-3
  pool.add_prompts(4, 4);  // the next step's, ahead
  PoolSettings settings = pool_settings(16, 0.5);
  settings.count_prompts_below = 4;
  const PhaseStats first = pool.generate_phase(policy.model, sampling(), 0, settings);
  EXPECT_EQ(first.phase_samples, 32);
  // It stopped once half of prompts 0-3's 16 samples had finished; the slots they freed took
  // samples of prompts 4-7, so more rows ran than the first 16 samples alone could fill.
  const std::vector<Rollout> done = pool.take_complete_groups();
  EXPECT_GT(first.finished, 0);
  EXPECT_GT(first.occupancy.rows, first.steps);  // several rows per step
  EXPECT_GT(first.cut, 0);
  // The next phase at version 1 with bound 1: every group holding a version-0 token is on its
  // last chance, so the phase ends only when all of them are complete, whatever the threshold.
  settings.finish_older_than = 1;
  settings.count_prompts_below = 8;
  settings.finish_threshold = 0.1;
  policy.perturb(5);
  pool.generate_phase(policy.model, sampling(), 1, settings);
  std::set<int64_t> returned;
  for (const Rollout& r : done) returned.insert(r.sample_id);
  for (const Rollout& r : pool.take_complete_groups()) returned.insert(r.sample_id);
  // All groups of prompts 0-3 are complete, and nothing left in the pool is older than
  // version 1: the bound drops nothing.
  for (int64_t id = 0; id < 16; ++id) EXPECT_TRUE(returned.count(id)) << "sample " << id;
  pool.enforce_staleness(1, StalePolicy::Drop);
  EXPECT_EQ(pool.counters().dropped_samples, 0);
  EXPECT_EQ(pool.counters().regenerated_samples, 0);
}

// Ranks end their phases together: while another rank is not ready, a ready rank keeps
// decoding; a rank with nothing at all still takes part in every agreement.
TEST(RolloutPool, APhaseEndsOnlyWhenEveryRankIsReady) {
  LengthTask task;
  auto run_phase = [&](int not_ready_steps, RolloutPool& pool, int* calls) {
    Policy policy(41);
    PoolSettings settings = pool_settings(16, 0.25);
    settings.all_ranks_ready = [&](bool ready) {
      ++*calls;
      return ready && *calls > not_ready_steps;  // "another rank" is ready after that many steps
    };
    return pool.generate_phase(policy.model, sampling(), 0, settings);
  };
  RolloutPool alone(task, kGroup, AdvantageEstimator::Grpo),
      waiting(task, kGroup, AdvantageEstimator::Grpo);
  alone.add_prompts(0, 4);
  waiting.add_prompts(0, 4);
  int alone_calls = 0, waiting_calls = 0;
  const PhaseStats a = run_phase(0, alone, &alone_calls);
  const PhaseStats b = run_phase(a.steps + 3, waiting, &waiting_calls);
  EXPECT_EQ(alone_calls, a.steps);  // one agreement per step, stopping at the first ready one
  // The waiting rank stepped on (decoding what it had, then with nothing: all bubble).
  EXPECT_EQ(waiting_calls, a.steps + 4);
  EXPECT_EQ(b.occupancy.steps, waiting_calls);
  EXPECT_GE(b.finished, a.finished);
  EXPECT_GT(b.occupancy.bubble_seconds, 0.0);
  // An empty pool still agrees once per step until the others are ready.
  RolloutPool empty(task, kGroup, AdvantageEstimator::Grpo);
  int empty_calls = 0;
  const PhaseStats e = run_phase(5, empty, &empty_calls);
  EXPECT_EQ(empty_calls, 6);
  EXPECT_EQ(e.generated_tokens, 0);
}

}  // namespace
}  // namespace rlf
