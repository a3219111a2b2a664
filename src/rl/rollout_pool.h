// StaleSync's rollout pool: the samples a rank has in flight across generation phases. A phase
// decodes them with continuous batching and may stop early (the long-tail cut); unfinished
// samples stay as partial rollouts and resume in a later phase under newer weights.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "src/io/in_flight_sample.h"
#include "src/model/generation.h"
#include "src/rl/ppo.h"
#include "src/rl/rollout.h"
#include "src/rl/task.h"

namespace rlf {

struct PoolSettings {
  int slots = 0;  // sequences decoded at once (KV cache slots); 0: all of the phase's samples
  // In (0, 1]: the phase ends after the first step at which finished / phase samples reaches it.
  // Counted in steps, never in wall time, so a cut is reproducible.
  double finish_threshold = 1.0;
  // A group holding a token older than this version (in any member, finished or not) is on its
  // last phase: left incomplete again, it would exceed the staleness bound when trained, so the
  // phase does not end while one of its members is unfinished. With a bound s and the phase at
  // version v, v - s + 1. The lowest int: no group is on its last phase.
  int finish_older_than = std::numeric_limits<int>::min();
  // Lookahead: only samples of prompts below this id are the phase's own work and count towards
  // finish_threshold; samples of later prompts (added ahead of their step) fill the slots that
  // free up, so the batch stays full, and are cut with the rest. The largest id: all count.
  int64_t count_prompts_below = std::numeric_limits<int64_t>::max();
  // Data-parallel ranks that train together: when set, a phase ends only at the first step at
  // which every rank is ready (the hook is collective: every rank calls it once per step with its
  // own readiness and gets whether all are ready). A rank that is ready keeps decoding its
  // lookahead meanwhile instead of waiting for the slowest rank idle. Deterministic: readiness is
  // counted in steps, never in wall time.
  std::function<bool(bool ready)> all_ranks_ready;
};

// What happens to a sample in the pool holding tokens older than the staleness bound allows.
enum class StalePolicy {
  Regenerate,  // its tokens are discarded and it starts again from its prompt
  Drop,        // its whole group leaves the pool and is never returned
};

struct PoolCounters {
  int64_t generated_tokens = 0;
  // Prompt + response tokens prefilled again to rebuild the KV cache of resumed partials.
  int64_t recomputed_prefix_tokens = 0;
  int64_t cut_samples = 0;  // partials carried out of a phase (once per phase they survive)
  int64_t resumed_samples = 0;
  int64_t regenerated_samples = 0;
  int64_t discarded_tokens = 0;  // tokens of regenerated samples
  int64_t dropped_groups = 0;
  int64_t dropped_samples = 0;
};

struct PhaseStats {
  int phase_samples = 0;  // unfinished samples at the start of the phase
  int steps = 0;          // sampling steps: the first prefill, then one per decode step
  int64_t generated_tokens = 0;
  int finished = 0;
  int cut = 0;               // still decoding when the phase stopped: now partial
  BatchOccupancy occupancy;  // capacity: the phase's slots
  // The steps begun (inside a pipeline the one begun after the agreed last step too, undone but
  // run through the stages) and their decode rows, prefill sequences and prefill tokens: what
  // the steps' forwards run (a TP group's collectives carry them), and inside a pipeline what a
  // lane's messages carry.
  int64_t steps_begun = 0, decode_rows = 0, prefill_sequences = 0, prefill_tokens = 0;
};

class RolloutPool {
  // A sample as it will be returned: its response, log-probs and versions grow phase by phase
  // (the versions are meaningful once the response is not empty); reward and advantage are
  // filled when its group is taken.
  struct Member {
    Rollout rollout;
    bool finished = false;
  };
  using Group = std::vector<Member>;
  // One sample of a phase: where it lives in the pool and, while decoding, its cache slot.
  struct Sequence {
    int64_t prompt_id = 0;
    int member = 0;
    int slot = -1;
  };

 public:
  RolloutPool(const Task& task, int group_size, AdvantageEstimator estimator);

  // Adds `prompts` prompt groups starting at first_prompt, with the prompts and sample ids of
  // generate_rollouts (sample id = prompt id * group_size + member).
  void add_prompts(int64_t first_prompt, int prompts);

  // Brings every sample in the pool (unfinished, or finished but waiting for its group) whose
  // oldest token is older than min_version within the bound: per policy, it starts again from
  // its prompt, or its whole group is dropped.
  void enforce_staleness(int min_version, StalePolicy policy);

  // One generation phase with the weights of `version` over every unfinished sample (partials
  // first, then samples not started, each in sample-id order). At most settings.slots sequences
  // decode at once; a finished one frees its slot for the next waiting sample. A partial's prompt
  // and response so far are prefilled with the current weights, and its new tokens carry
  // `version`. With expert parallelism the call is collective over the EP group: each rank cuts
  // by its own samples, then steps with zero rows until every rank has stopped.
  PhaseStats generate_phase(Transformer<float>& model, const GenerationSettings& sampling,
                            int version, const PoolSettings& settings);

  // The same phase a step at a time, for a caller that computes the logits itself: generate_phase
  // on one model, or a pipeline's stages (src/runtime/pipeline_rollout.h). A step: begin_step()
  // admits waiting samples into free cache slots and gives the rows to run; the caller runs the
  // decode rows, then the prefill rows, over the cache slots; end_step() samples the next tokens
  // from their logits and says whether this rank is ready to end the phase; settle() takes the
  // readiness the ranks agreed on (settings.all_ranks_ready is the caller's to call) and the
  // phase is over once stopped(). The pool must outlive the Phase and not change meanwhile.
  class Phase {
   public:
    Phase(RolloutPool& pool, int version, const PoolSettings& settings);
    // Unfinished samples at the start (none: a rank alone has nothing to do).
    int samples() const { return stats_.phase_samples; }
    int slots() const { return slots_; }  // the KV cache slots the phase decodes in
    int longest_prompt() const { return longest_prompt_; }

    struct Step {
      // One row per running sequence: its last token, cache slot and that token's position.
      std::vector<int> decode_tokens, decode_slots, decode_positions;
      // Each admitted sequence's prompt and response so far (a resumed partial's prefix is
      // prefilled again), packed: offsets into tokens, one cache slot each.
      std::vector<int> prefill_tokens, prefill_offsets{0}, prefill_slots;
      int decode_rows() const { return int(decode_slots.size()); }
      int prefill_rows() const { return int(prefill_slots.size()); }
    };
    Step begin_step();
    // Undoes the last begin_step's admissions, for a caller that began a step before the ranks
    // agreed to end the phase at the step before it (nothing of the step was run on the pool).
    void undo_begin_step();
    // The logits [decode_rows, V] and [prefill_rows, V] of the step begun (null where it has no
    // such rows), on `model`'s backend; returns this rank's readiness.
    bool end_step(Transformer<float>& model, const GenerationSettings& sampling,
                  const float* decode_logits, const float* prefill_logits);
    void settle(bool ready);
    bool stopped() const { return stopped_; }
    const PhaseStats& stats() const { return stats_; }

   private:
    RolloutPool& pool_;
    int version_;
    PoolSettings settings_;
    std::vector<Sequence> waiting_;
    size_t next_waiting_ = 0;
    std::vector<Sequence> decoding_;  // in phase order: admission preserves it
    std::vector<Sequence> admitted_;  // the step's
    std::vector<int> free_slots_;     // lowest slot last, so slots are reused lowest first
    // As they stood before the last begin_step (undo_begin_step).
    size_t next_waiting_before_ = 0;
    std::vector<int> free_slots_before_;
    PoolCounters counters_before_;
    std::set<int64_t> last_phase_;  // groups on their last chance (finish_older_than)
    int64_t counted_samples_ = 0, counted_finished_ = 0;
    int slots_ = 0, longest_prompt_ = 0;
    bool stopped_ = false;
    PhaseStats stats_;
    std::chrono::steady_clock::time_point step_began_;
  };

  // Removes the groups whose every member has finished and returns them as scored rollouts with
  // group advantages, in sample-id order.
  std::vector<Rollout> take_complete_groups();

  // Rewards of the groups taken from now on blend in this learned reward (null: the task's only).
  void set_learned_reward(RolloutReward* learned) { learned_ = learned; }

  size_t in_flight_samples() const;

  // Every sample in the pool, in sample-id order, as it stands between phases: what a checkpoint
  // saves. restore() refills an empty pool of the same task and group size with them (counters
  // stay this process's), so the phases that follow are the ones the saved pool would have run.
  std::vector<InFlightSample> saved_samples() const;
  // std::invalid_argument when the pool is not empty or the samples do not form whole groups.
  void restore(const std::vector<InFlightSample>& samples);
  const PoolCounters& counters() const { return counters_; }

 private:
  Member& member(const Sequence& s) { return groups_.at(s.prompt_id)[size_t(s.member)]; }
  std::vector<Sequence> phase_order() const;
  void restart(Member& m);
  // Drops finished sequences from `decoding` and returns their slots to `free_slots` (kept
  // sorted so the lowest free slot is last).
  void release_finished(std::vector<Sequence>& decoding, std::vector<int>& free_slots);
  // Samples one token per row of logits into each sequence's response; returns how many ended.
  int append_tokens(Transformer<float>& model, const GenerationSettings& sampling, int version,
                    const float* logits, const std::vector<Sequence>& sequences);

  const Task& task_;
  int group_size_;
  AdvantageEstimator estimator_;
  std::map<int64_t, Group> groups_;  // by prompt id, so iteration is in sample-id order
  PoolCounters counters_;
  RolloutReward* learned_ = nullptr;
};

}  // namespace rlf
