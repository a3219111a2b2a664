// Setting up the ranks that train in a multi-rank `train` (the learners of a disaggregated run,
// every rank of a fused run): the seeded warm start, expert parallelism, the frozen reference
// policy for the KL term and AdamW.
#pragma once

#include <memory>
#include <optional>

#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"
#include "src/model/optimizer.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

struct WarmStart {
  Evaluation initial, before_rl;  // held-out accuracy, measured on the root only
};

// The same seeded warm start (SFT) on every learner, so all hold identical weights; the root
// evaluates before and after it. A model that stores only its own experts runs it on a whole
// model in a temporary arena and keeps its part (for models too large for that, start from
// --init with --sft-steps 0).
WarmStart warm_start_learner(Policy& policy, const RunOptions& run,
                             const PolicyOptions& policy_options, const SftSchedule& sft, bool root,
                             RunDirectory& dir, TraceRecorder& trace);

// EP groups of `degree` consecutive ranks of `role` with one dispatcher per layer attached to
// `model` (and, with overlap_chunks > 1, overlapped experts for training); null for degree 1.
// `redundant_slots`: spare expert slots per EP rank (the model built with the slot-space shard).
// Collective over role.comm.
std::unique_ptr<RoleExpertParallel> attach_expert_parallel(
    Transformer<float>& model, const HierarchicalComm& role, Links& links, int degree,
    DispatchMode mode, int overlap_chunks = 1, int redundant_slots = 0);

struct LearnerState {
  std::unique_ptr<Transformer<float>> reference;  // frozen start of RL (KL term), or null
  std::unique_ptr<AdamW<float>> optimizer;        // sharded like the model under EP
  // Set when this state allocated the model's gradients: the arena mark just before them. The
  // gradients and AdamW's moments are then the top of the device arena (what offload moves).
  std::optional<Arena::Mark> gradients_mark;
};

// Before the warm start, in the policy's device arena: the reference's buffer (with the model's
// expert shard) and, for a model built without gradients, its gradients.
LearnerState allocate_learner_state(Policy& policy, const RlOptions& rl);
// After the warm start and the EP attach: the reference takes the warmed-up weights (with `ep`
// it gets its own dispatchers, collective over the EP group) and AdamW is built.
void start_learner_state(LearnerState& state, Policy& policy, const RlOptions& rl,
                         RoleExpertParallel* ep);

}  // namespace rlf
