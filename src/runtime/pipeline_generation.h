// Generation inside a pipeline: the stages generate together from the layers each already stores,
// so no rank borrows another stage's layers (fused `train --actor-pipeline-parallel P`, P the
// training pipeline's degree: RL Fusion with no layout switch at all).
//
// The pipeline's sequences are cut into groups (one per stage, so that every stage has work while
// the others compute); each group's prefill and then each decode step flow through the virtual
// stages in order (virtual stage s on pipeline rank s mod P, its layer range from the chunk
// boundaries): a stage runs its layers over the group's rows and sends the hidden rows on; the
// last stage runs the head, draws the next token of every row and sends the tokens of the rows
// still running back to the first stage, which embeds them for the next decode step. A group's
// prompts enter in up to 4 pieces, so the last stage starts after one piece has passed the stages
// before it (the pipeline's fill), and the group's first decode step follows its last piece. Each
// rank keeps the KV cache of its own layers only. Tokens are drawn by the counter-based sampler
// keyed by (seed, sample id, position), so a sample does not depend on its group: the samples are
// the ones generate() draws from the whole model.
//
// Every message is a point-to-point send to the next rank of the pipeline (nonblocking: a ring
// of stages each sending at once must not wait on each other), counted on the Links and delayed by
// their emulation. At the end the last stage broadcasts the samples over the pipeline.
//
// With tensor parallelism inside the stages (TP x PP), each TP rank runs this over its own
// pipeline (the stages' ranks of its TP rank) from its slices of its stage's layers, and the TP
// group's collectives run inside the layers. The TP ranks of a stage make the same calls in the
// same order: each rank's calls follow from the messages of its one predecessor, in the order
// sent, which are the same on every TP rank (a stage's output rows are whole on each of its TP
// ranks after the row-parallel sums, and the head's logits too, so every last-stage TP rank draws
// the same tokens).
//
// With expert parallelism inside the stages (PP x EP), a stage's MoE layers dispatch over its EP
// group: the same stage in E pipelines, which generate their own sequences. Their passes pair up
// in the same way, as long as every pipeline makes the same passes: each has P groups (some empty
// when it has fewer than P sequences), and a group runs on (with no rows when its own sequences
// have ended) until it has ended in every pipeline of the group, which the last stages agree on
// after each of the group's steps (Transformer::on_any_expert_parallel_rank).
#pragma once

#include <cstdint>
#include <vector>

#include "mpi_comm/links.h"
#include "src/model/generation.h"
#include "src/model/pipeline_stage.h"

namespace rlf {

// A group's prompts enter the pipeline in this many pieces: the last stage, which draws every
// token and so paces the decode rounds, starts once the first piece, not the whole first group,
// has passed the stages before it (the pipeline's fill), and the group's first decode step waits
// for all of its pieces.
inline constexpr int kPipelinePrefillPieces = 4;

// The prefill pieces of a group of `group_sequences` sequences: kPipelinePrefillPieces, or without
// EP fewer for a smaller group (with EP every pipeline of an EP group makes as many passes, some
// with no rows).
int pipeline_prefill_pieces(int group_sequences, bool expert_parallel);

// Collective over `pipeline` (rank = pipeline stage, size P >= 2): every rank passes the same
// `prompts` and `sample_ids` (the pipeline's sequences) and its `stage` model storing the layers
// of `chunks` (pipeline_rank_chunks: chunk k of rank r is virtual stage k P + r; every rank the
// same number of them), with the embedding on rank 0 and the head on rank P - 1. Returns every
// sequence's sample on every rank. `occupancy`, when given, gets each of this rank's passes (rows
// and wall time; capacity: the largest group). With a TP `stage`, every TP rank of every stage
// passes the same prompts; with an EP `stage` (its dispatchers attached), every rank of its EP
// group calls this at once, each pipeline with its own prompts.
std::vector<GeneratedSample> generate_pipelined(Transformer<float>& stage,
                                                const std::vector<LayerRange>& chunks,
                                                const std::vector<std::vector<int>>& prompts,
                                                const std::vector<int64_t>& sample_ids,
                                                const GenerationSettings& settings,
                                                MPI_Comm pipeline, Links& links,
                                                BatchOccupancy* occupancy = nullptr);

// The same for this rank's own `prompts`: the pipeline's ranks' prompts gathered in rank order,
// generated together, and this rank's own samples returned (a drop-in for generate() on a
// pipeline stage).
std::vector<GeneratedSample> generate_own_prompts_pipelined(
    Transformer<float>& stage, const std::vector<LayerRange>& chunks,
    const std::vector<std::vector<int>>& prompts, const std::vector<int64_t>& sample_ids,
    const GenerationSettings& settings, MPI_Comm pipeline, Links& links,
    BatchOccupancy* occupancy = nullptr);

}  // namespace rlf
