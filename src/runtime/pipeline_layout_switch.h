// RL Fusion's layout switch for a pipeline-parallel policy (training at PP p, or TP T x PP p;
// generation data-parallel, or at TP T): before a generation phase every rank of a pipeline
// receives the layers of the other stages (with TP first the other TP ranks' slices of its own
// stage, or with generation at TP T only its own TP slice of the other stages) into a whole model
// of its own (a buffer the phase frees), generates from it (as a replica, or with its TP group),
// and trains
// again on its stage's own buffer, which the switch only reads; so the round trip leaves the stage
// bit for bit as it was.
#pragma once

#include <cstdint>

#include "src/model/parameter_layout.h"
#include "src/runtime/pipeline_groups.h"

namespace rlf {

// Copies every tensor of `from` that `to_layout` also stores (tensors of the same model matched
// by their whole-model names; layer-sharded, unsliced layouts that store the same experts, or a
// `to_layout` storing some experts of a `from` storing all: its own experts' rows, first in its
// slots when it has redundant ones, the spare slots left as they are).
void copy_shared_tensors(const float* from, const ParameterLayout& from_layout, float* to,
                         const ParameterLayout& to_layout);

// Collective over groups.pipeline(): writes the whole model into `whole` (laid out by
// `whole_layout`, the unsharded layout of the model): this rank's stage from `stage_params`
// (laid out by groups.stage_layout(groups.stage())) by a local copy, every other stage's tensors
// received from their stage (an allgather inside the pipeline). The stages hold the experts
// `whole_layout` holds: with EP inside the stages, groups.generation_layout() (every layer, the
// pipeline's experts), or with every expert a whole stage that RoleExpertParallel gathered. Every
// rank sends its stage to each other rank of its pipeline, counted on groups.links() (and, with
// link emulation, each stage received over an inter-node link delays the receiver by its emulated
// time). Returns the bytes this rank received: the model less its own stage. With TP
// (groups.tensor_parallel()), collective over the model-parallel group: `stage_params` is this
// rank's slice of its stage (the layout of groups.stage_layout(stage, the experts `whole_layout`
// holds) with its TensorSlice); the TP group first assembles the stage's whole tensors (an
// allgather of the cut tensors' slices, counted: each rank sends its slices to the T - 1 others),
// then every TP rank's pipeline gathers the stages as above. The bytes received then add the other
// TP ranks' slices. A `whole_layout` with a TP slice of degree G dividing T (generation at TP G,
// --actor-tensor-parallel G; slice rank % G) regroups the stage to that slice instead
// (regroup_tensor_slices: only the TP mates' slices it lacks, counted; none at G = T), then the
// pipeline gathers the other stages' G slices, and `whole` is this rank's G slice of the whole
// model (std::invalid_argument for another slice). Without TP, a sliced `whole_layout` (training at
// TP 1 generating at TP G) makes each stage send every other rank of its pipeline that rank's
// slice of its layers (an all-to-all: the ranks of a pipeline may hold different slices), so
// `whole` is this rank's slice of every layer and the bytes received are the other stages'
// slices only. With `root` >= 0 (a
// stage: the writer of a checkpoint or of the saved model) only that stage of each pipeline
// assembles the model (a gather to it, every other stage sending its stage there, counted); the
// others leave `whole` untouched (it may be null), so no rank but the root holds more than its
// stage. With TP and an unsliced `whole_layout`, only TP rank 0's pipeline gathers: each stage's TP
// slices first come together on its TP rank 0 (gather_tensor_parallel_on_rank_zero, counted), and
// the other TP ranks return after sending theirs (a sliced `whole_layout` without TP takes no
// root). Returns the bytes this rank received.
uint64_t gather_pipeline_model(const float* stage_params, const PipelineGroups& groups,
                               float* whole, const ParameterLayout& whole_layout, int root = -1);

// Whether gather_pipeline_model with root 0 and an unsliced whole layout fills `whole` on this
// rank: the first stage, with TP its TP rank 0.
bool assembles_pipeline_model(const PipelineGroups& groups);

}  // namespace rlf
