// `rlfusion train --mode fused` on more than one rank (RL Fusion): every rank is an actor and a
// learner. Each step every rank generates and scores its block of the step's prompts with the
// current weights (rank r of W holds prompts [r P / W, (r + 1) P / W)), then all ranks train
// data-parallel on exactly the samples they generated. No device waits while another one
// generates, and no weights move between roles: generation and training share one parameter
// buffer, so there is no weight sync at all. With --expert-parallel D the routed experts are
// sharded over EP groups of D consecutive ranks; --actor-expert-parallel G != D gives generation
// its own layout (EP groups of G ranks), switched to rank to rank before each generation phase
// (src/runtime/layout_switch.h). With --tensor-parallel T (and --pipeline-parallel P),
// --actor-tensor-parallel G (dividing T) sets generation's TP degree: groups of G consecutive
// ranks generate from each rank's G slice of every layer, regrouped inside the TP group and, with a
// pipeline, gathered over it for the phase (G = T: the training TP groups; G = 1: data-parallel
// from the whole model; src/runtime/pipeline_layout_switch.h, src/model/tensor_parallel.h); the
// samples then reach the ranks that train them.
//
// `fused_all` (--mode fused-all): the frozen reference (--kl-coef > 0) and the learned reward model
// (--reward-model) live in the same device arena as the policy on every rank, and the memory plan
// counts them before any work; in plain fused mode the reward model gets a host arena of its own.
// Placement never changes the math: both modes train the same weights bit for bit.
#pragma once

#include <string>

#include "mpi_comm/topology.h"
#include "src/app/disaggregated_train.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/sft_phase.h"
#include "src/app/train_checkpoints.h"
#include "src/app/train_result.h"

namespace rlf {

int run_fused_train(const RunOptions& run, const PolicyOptions& policy_options,
                    const SftSchedule& sft, const RlOptions& rl, LayoutConfig layout,
                    const DisaggregatedOptions& options, bool fused_all,
                    const std::string& resolved_config, TrainResult* result = nullptr,
                    const CheckpointOptions& checkpoints = {});

}  // namespace rlf
