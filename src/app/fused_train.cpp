#include "src/app/fused_train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "kernels/error.h"
#include "mpi_comm/wait_policy.h"
#include "src/app/build_info.h"
#include "src/app/ep_exchange_report.h"
#include "src/app/expert_rows_report.h"
#include "src/app/fused_memory.h"
#include "src/app/learned_reward.h"
#include "src/app/learner_hooks.h"
#include "src/app/learner_setup.h"
#include "src/app/pipeline_ep_overlap_report.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/app/pipeline_reference.h"
#include "src/app/pipeline_stage_report.h"
#include "src/app/random_delay.h"
#include "src/app/rl_progress.h"
#include "src/app/sample_reordering.h"
#include "src/app/tensor_parallel_train.h"
#include "src/app/traced_training.h"
#include "src/app/train_finish.h"
#include "src/io/parameter_file.h"
#include "src/io/run_directory.h"
#include "src/io/trace.h"
#include "src/model/activation_memory.h"
#include "src/model/lr_schedule.h"
#include "src/model/overlapped_experts.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/rl/rollout_pool.h"
#include "src/runtime/expert_aligned_tensor_groups.h"
#include "src/runtime/expert_weight_sync.h"
#include "src/runtime/layout_switch.h"
#include "src/runtime/pipeline_generation.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/pipeline_rollout.h"
#include "src/runtime/training_offload.h"

namespace rlf {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int run_fused_train(const RunOptions& run, const PolicyOptions& policy_options,
                    const SftSchedule& sft, const RlOptions& rl, LayoutConfig layout,
                    const DisaggregatedOptions& options, bool fused_all,
                    const std::string& resolved_config, TrainResult* result,
                    const CheckpointOptions& checkpoints) {
  const char* mode = fused_all ? "fused-all" : "fused";
  layout.fused = true;
  Topology topology(MPI_COMM_WORLD, layout);
  const int ranks = topology.world_size();
  const ModelConfig model_config = load_model_config(run.model);
  // Tensor parallelism: each TP group is one replica of the policy whose ranks generate and
  // train the same samples (ConfigError on every rank when the degree does not fit).
  const std::unique_ptr<TensorParallel> tp =
      make_train_tensor_parallel(options, model_config, topology);
  // Generation runs collectively over the training TP groups at --actor-tensor-parallel T, over
  // TP groups of G consecutive ranks from regrouped slices at 1 < G < T (or from slices cut from
  // the whole model or stage after training at TP 1; after EP training, groups of the ranks
  // holding one expert block), else data-parallel on every rank from a
  // whole model of its own: with a pipeline, each rank trains its own block of
  // the samples whoever generated them (a TP rank its share of its group's); without one, a TP
  // group trains the samples its ranks generated.
  const bool pipelined = options.pipeline_parallel > 1;
  const int generation_tp = generation_tensor_parallel(options);
  const bool tp_generates = tp && generation_tp == tp->degree();
  const bool tp_regrouped_generation = tp && !pipelined && generation_tp < tp->degree();
  // Data-parallel training generating at TP G: each rank cuts its generation slice from its own
  // whole model (nothing received). (Pipeline training at TP 1 generating at TP G: each stage
  // receives its slice of the other stages, gather_pipeline_model.)
  const bool sliced_generation = !tp && !pipelined && generation_tp > 1;
  // The degree fits the model and the ranks (ConfigError naming the option, on every rank).
  if (!tp && generation_tp > 1)
    validate_tensor_parallel(model_config, generation_tp, false, ranks, "--actor-tensor-parallel");
  // Generation TP groups of their own for 1 < G < T, or for G > 1 after training at TP 1 (made
  // below, once the pipelines are known); with TP G, ranks / G groups generate.
  const bool own_generation_groups = generation_tp > 1 && (!tp || generation_tp < tp->degree());
  const int replicas = tp_generates || own_generation_groups ? ranks / generation_tp : ranks;
  const int training_blocks = pipelined ? ranks : tp ? tp->replicas() : ranks;
  // Every rank checks the same inputs, so a bad value stops all of them before any work.
  const int prompt_blocks = std::max(replicas, training_blocks);
  if (rl.prompts % prompt_blocks != 0) {
    throw ConfigError(std::string("--mode ") + mode + ": --prompts " + std::to_string(rl.prompts) +
                      " must divide evenly among the " + std::to_string(prompt_blocks) +
                      (prompt_blocks == ranks ? " ranks" : " tensor-parallel groups") +
                      " (each generates and trains on its own block of prompts)");
  }
  const int trained_prompts = rl.prompts / training_blocks;
  // A pipeline rank's block of samples (with StaleSync up to the step's: finished lookahead
  // groups).
  const int pipeline_rank_samples =
      (rl.staleness > 0 ? rl.prompts : trained_prompts) * rl.group_size;
  // Pipeline parallelism: pipelines of consecutive ranks train one replica stage by stage; every
  // rank trains its own block of prompts.
  const std::unique_ptr<PipelineGroups> pp = make_train_pipeline(
      options, model_config, trained_prompts * rl.group_size, rl.micro_batch, rl.group_size,
      rl.minibatches, topology, stage_cost_probe(run, policy_options, rl.micro_batch), tp.get());
  // The generation TP groups of their own: G consecutive ranks, or, after EP training at TP 1, the
  // G ranks holding one expert block in G x E consecutive ranks of the order in which the training
  // EP groups are consecutive (the ranks, or with pipelines the stage-major order), so that
  // generation runs over training's EP groups and no expert moves (expert_aligned_tensor_groups.h).
  std::unique_ptr<TensorParallel> generation_groups;
  if (own_generation_groups) {
    generation_groups =
        !tp && options.expert_parallel > 1
            ? make_expert_aligned_tensor_parallel(
                  pp ? pp->stage_major().comm : topology.role_comm().comm, generation_tp,
                  options.expert_parallel, options.tensor_parallel_attention_only, model_config,
                  topology.links())
            : std::make_unique<TensorParallel>(topology.role_comm().comm, generation_tp,
                                               options.tensor_parallel_attention_only, model_config,
                                               topology.links());
  }
  // The TP groups generation runs over (null: data-parallel).
  const TensorParallel* generation_tp_groups = tp_generates ? tp.get() : generation_groups.get();
  const int replica =
      generation_tp_groups ? generation_tp_groups->replica() : topology.world_rank();
  // The block of prompts each rank of this rank's pipeline generates and keeps (for
  // pipeline_rollouts): its world rank's, but over expert-aligned generation TP groups its place
  // in their order (of the stage-major ranks), where TP rank t of group g keeps block g G + t.
  std::vector<int> pipeline_member_blocks;
  if (pp) {
    const bool aligned = generation_groups && !tp && options.expert_parallel > 1;
    const std::vector<int>& stage_major = pp->stage_major().world_ranks;
    for (const int member : pp->model_parallel().world_ranks) {
      const auto at = std::find(stage_major.begin(), stage_major.end(), member);
      pipeline_member_blocks.push_back(
          aligned ? expert_aligned_tensor_position(int(at - stage_major.begin()), generation_tp,
                                                   options.expert_parallel)
                  : member);
    }
  }
  // The model a pipeline rank, a TP rank generating at a lower TP degree, or a data-parallel rank
  // generating at TP G generates from: every layer (with TP generation, its TP slice).
  // --actor-pipeline-parallel P: the training pipelines generate their ranks' prompts together,
  // each stage from its own layers (generate_pipelined): nothing borrowed, nothing switched.
  const bool pipeline_generates = pp && options.actor_pipeline_parallel > 1;
  const bool borrows_whole_model =
      (pp && !pipeline_generates) || tp_regrouped_generation || sliced_generation;
  // (TP x EP generating at a lower TP degree, or EP training generating at TP G: every layer
  // with the rank's training expert slots, its spare replica slots included, which its training
  // EP group's dispatchers route to.)
  ExpertShard regrouped_experts;
  if ((tp_regrouped_generation || sliced_generation) && options.expert_parallel > 1) {
    regrouped_experts = expert_shard_of(tp ? tp->replica() : topology.world_rank(),
                                        options.expert_parallel, model_config.n_experts);
    regrouped_experts.redundant = options.rebalance.redundant_experts;
  }
  const ParameterLayout unsliced_generation_layout =
      pp ? pp->generation_layout() : ParameterLayout(model_config, regrouped_experts);
  const ParameterLayout whole_generation_layout =
      generation_tp_groups ? with_tensor_slice(model_config, unsliced_generation_layout,
                                               generation_tp_groups->slice())
                           : unsliced_generation_layout;
  // A pipeline stage generating at its training TP layout (data-parallel, or over its training TP
  // group; with EP over its training EP group, with redundant expert slots in their slot layout,
  // or at a generation EP degree of its own, switched from the view) borrows only the other
  // stages' layers and generates from a stitched view of them and its own stage (Transformer's
  // stitched view: no copy of its stage); with slices regrouped (training TP, generation at
  // another TP degree) it copies the whole model.
  const bool stitched_generation =
      pp && !pipeline_generates && (!tp || tp_generates) && (!generation_tp_groups || tp_generates);
  // What such a stage borrows: the layers (and the embedding or head) it does not store.
  const LayerShard other_stages =
      stitched_generation ? other_stages_layer_shard(pp->stage_layout(pp->stage()).layer_shard(),
                                                     model_config.n_layers)
                          : LayerShard{};
  const int experts = model_config.n_experts;
  // With pipeline parallelism the EP groups are ranks of one stage in consecutive pipelines (its
  // data-parallel group), with tensor parallelism the ranks with the same TP rank in consecutive
  // TP groups (its data-parallel group): generation and training both run on them.
  const HierarchicalComm* ep_role =
      pp ? &pp->data_parallel() : (tp ? &tp->data_parallel() : nullptr);
  const std::vector<int> ep_ranks =
      ep_role ? ep_role->world_ranks : topology.ranks_of(Role::Learner);
  validate_role_expert_parallel("--expert-parallel", options.expert_parallel, ep_ranks, experts,
                                options.ep_dispatch, topology.links(), "fused");
  // In fused mode the actors' degree is the generation layout's.
  const int generation_degree = options.actor_expert_parallel;
  validate_role_expert_parallel("--actor-expert-parallel", generation_degree, ep_ranks, experts,
                                options.ep_dispatch, topology.links(), "fused");
  const bool switch_layouts = generation_degree != options.expert_parallel;
  const int rank = topology.world_rank();
  const bool root = rank == 0;
  // With --redundant-experts every training EP rank also holds spare slots for replicas.
  const int redundant = options.rebalance.redundant_experts;
  if (redundant > 0) {
    validate_redundant_slots(redundant, experts, options.expert_parallel, "--redundant-experts");
  }
  // (With TP the EP rank is the TP group's: its place among the TP groups.)
  const int ep_place = tp ? tp->replica() : rank;
  ExpertShard own_experts = pp ? pp->expert_shard()
                            : options.expert_parallel > 1
                                ? expert_shard_of(ep_place, options.expert_parallel, experts)
                                : ExpertShard{};
  own_experts.redundant = redundant;
  // With offload the gradients are allocated later, next to AdamW's moments at the top of the
  // device arena, so that one rewind frees all three.
  Policy policy = make_policy(
      run, policy_options, /*with_gradients=*/!options.offload, own_experts, tp.get(),
      pp ? stage_layer_shard(pp->chunks(pp->stage()), model_config.n_layers) : LayerShard{});
  FusedMemoryPlan memory_plan;
  {
    // Bad input stops every rank here, before any output: the analytic peaks must fit the arena.
    const ExpertShard generation_experts =
        pp                      ? pp->expert_shard()
        : generation_degree > 1 ? expert_shard_of(ep_place, generation_degree, experts)
                                : ExpertShard{};
    const Task& task = *policy.task;
    const int longest = 2 + task.max_prompt_chars() + task.max_response_chars();
    const std::optional<ModelConfig> reward_model =
        fused_all && !rl.reward_model.empty()
            ? std::optional<ModelConfig>(parameter_file_model(rl.reward_model))
            : std::nullopt;
    // With --reorder-samples a rank may train any of the step's samples.
    const bool reordered = parse_reorder_costs(options.reorder_samples) != ReorderCosts::Off;
    const FusedBatch batch{
        rl.prompts / replicas * rl.group_size,
        1 + task.max_prompt_chars(),
        longest,
        rl.micro_batch,
        rl.temperature > 0,
        rl.staleness > 0 ? longest - 1 : 0,
        reordered ? rl.prompts * rl.group_size : trained_prompts * rl.group_size};
    // (PP x EP switching to a generation EP degree of its own: the whole model with the
    // generation shard's experts, those the pipeline lacks received into slots.)
    const ParameterLayout switched_layout(
        policy.config, expert_shard_of(pp ? pp->replica() : 0, generation_degree, experts));
    // (A TP group generating at its training degree generates on its ranks' slices: their KV
    // cache and activations hold the rank's heads only.)
    const ParameterLayout generation_layout =
        pp && switch_layouts
            ? (generation_tp_groups ? with_tensor_slice(policy.config, switched_layout,
                                                        generation_tp_groups->slice())
                                    : switched_layout)
        : borrows_whole_model ? whole_generation_layout
        : pipeline_generates  ? policy.model->layout()
        : tp_generates
            ? with_tensor_slice(policy.config, ParameterLayout(policy.config, generation_experts),
                                tp->slice())
            : ParameterLayout(policy.config, generation_experts);
    // The token split (below) in training and, on the training slices, in generation (a
    // pipeline stage's generation model is counted unsplit, an upper bound; its chunks: below).
    const bool splits = tp && !pp && !options.tensor_parallel_duplicate_experts;
    memory_plan = plan_fused_memory(policy.config, policy.model->layout(), generation_layout,
                                    switch_layouts, rl.kl_coef > 0,
                                    reward_model ? &*reward_model : nullptr, options.offload, batch,
                                    /*experts_migrate=*/options.rebalance.every > 0,
                                    ExpertTokenSplit{splits, splits && tp_generates});
    // A pipeline stage generates from the other stages' layers beside its own (stitched), or from
    // a whole model of its own (with EP, every layer with the pipeline's experts; with TP
    // generation, its TP slice); so does a TP rank generating data-parallel.
    if (pipeline_generates) {
      // Each stage holds the KV cache of its layers for all of its pipeline's samples and runs
      // one group of them (a stage's share) at a time, its prompts in pieces.
      const int pipeline_samples = pp->shape().stages * batch.samples;
      int group = (pipeline_samples + pp->shape().stages - 1) / pp->shape().stages;
      const int pieces = pipeline_prefill_pieces(group, options.expert_parallel > 1);
      int piece = (group + pieces - 1) / pieces;
      int piece_length = batch.longest_prompt;
      if (rl.staleness > 0) {
        // StaleSync: each rank's pool is a lane of its own slots (its batch), and a step may
        // prefill every slot with a resumed prefix (generate_phase_pipelined).
        group = piece = batch.samples;
        piece_length = std::max(batch.longest_prompt, batch.longest_prefill);
      }
      // (Instead of a data-parallel generation of the rank's own prompts; a learned reward's
      // scoring of them after it.)
      memory_plan.generation_activations = std::max(
          reward_scoring_peak_bytes(reward_model ? &*reward_model : nullptr, batch),
          pipeline_generation_peak_bytes(
              policy.config, policy.model->layout(), uniform_batch(piece, piece_length), group,
              pipeline_samples, batch.max_sequence, batch.sampled,
              /*expert_token_split=*/tp != nullptr && !options.tensor_parallel_duplicate_experts));
    } else if (stitched_generation) {
      add_pipeline_generation_model(memory_plan,
                                    ParameterLayout(policy.config, pp->expert_shard(), other_stages,
                                                    policy.model->layout().tensor_slice())
                                        .total());
    } else if (borrows_whole_model) {
      add_pipeline_generation_model(memory_plan, whole_generation_layout.total());
    }
    // A pipeline stage trains in activation arenas of its own, a micro-batch chunk in each, as
    // many at once as the schedule keeps in flight.
    if (pp) {
      add_pipeline_activations(
          memory_plan,
          pipeline_activation_bytes(
              *pp, policy.model->layout(),
              pipeline_micro_batch_sequences(*pp, rl.micro_batch, pipeline_rank_samples,
                                             options.micro_batches > 0),
              longest, tp && !options.tensor_parallel_duplicate_experts));
    }
    // The KL reference's and PP StaleSync's proximal log-probs come from forward-only passes over
    // the stages: a rank holds its reference stage (counted in the plan) and no whole copy.
    check_fused_memory_fit(memory_plan, policy.device->memory().capacity(), options.offload, mode);
  }
  // Before the learner state: with offload, the gradients and AdamW's moments must stay the top
  // of the device arena.
  const std::unique_ptr<LearnedReward> learned =
      load_learned_reward(rl, policy.device->ops(), fused_all ? &policy.device->memory() : nullptr,
                          run.device_memory_bytes());
  // Checkpoints are taken between steps; with StaleSync each rank's rollout pool goes with them.
  TrainCheckpoints saved(checkpoints, run, rl, policy.config, /*supported=*/true);
  RunDirectory dir(run.run_dir, resolved_config, /*writer=*/root, saved.resuming());
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&policy.device->memory());

  dir.log(
      "# rlfusion train (%s, %s): %s\n", mode,
      rl.staleness > 0 ? ("StaleSync s=" + std::to_string(rl.staleness)).c_str() : "synchronous",
      build_info().c_str());
  dir.log("# model %s (%.2fM parameters), task %s, seed %llu, run dir %s\n",
          policy.config.name.c_str(), policy.config.parameter_count() / 1e6,
          policy.task->name().c_str(), (unsigned long long)run.seed, dir.path().c_str());
  dir.log("%s", topology.layout_table().c_str());
  dir.log("# %s\n", describe_wait_policy().c_str());
  dir.log("%s", describe_learned_reward(rl, learned.get()).c_str());
  dir.log("%s", describe_router_skew(options.rebalance).c_str());
  saved.describe(dir);
  if (fused_all && rl.kl_coef > 0) {
    dir.log("# reference model (KL): %s in the device arena (with the policy)\n",
            format_bytes(size_t(policy.model->parameter_count()) * sizeof(float)).c_str());
  }
  const auto run_start = std::chrono::steady_clock::now();

  LearnerState learner = allocate_learner_state(policy, rl);
  RlPosition position;
  if (!saved.resuming()) {
    const WarmStart warm = warm_start_learner(policy, run, policy_options, sft, root, dir, trace);
    position.initial = warm.initial;
    position.before_rl = warm.before_rl;
  }
  Transformer<float>& model = *policy.model;
  const Task& task = *policy.task;
  const HierarchicalComm& all = topology.role_comm();
  Links& links = topology.links();
  std::unique_ptr<RoleExpertParallel> ep =
      attach_expert_parallel(model, ep_role ? *ep_role : all, links, options.expert_parallel,
                             options.ep_dispatch, pp ? 1 : options.ep_overlap_chunks, redundant);
  // The spare slots get their starting replicas before the reference copies the weights.
  if (ep) ep->fill_redundant_slots(model.parameters(), model.layout());
  // TP (with or without EP): each TP rank computes its share of its group's tokens' routed
  // experts in every MoE layer (the KL reference's too), unless
  // --tensor-parallel-duplicate-experts.
  const bool expert_token_split = tp && !options.tensor_parallel_duplicate_experts;
  // The generation models of their own (a pipeline stage's whole or stitched model, a regrouped
  // or cut TP slice) split their generation TP group's tokens the same way.
  const bool generation_token_split =
      generation_tp_groups != nullptr && !options.tensor_parallel_duplicate_experts;
  model.set_expert_token_split(expert_token_split);
  start_learner_state(learner, policy, rl, ep.get());
  if (learner.reference) learner.reference->set_expert_token_split(expert_token_split);
  if (pp) learner.optimizer->set_shard(pp->optimizer_shard(model.layout(), ep.get()));
  const TrainingState state{&model, learner.optimizer.get(), learner.reference.get()};
  // Router statistics per step into the trace and, with --rebalance-every, experts moved
  // between the training EP ranks (with their AdamW moments and the reference's weights). With
  // pipeline stages each stage records its own layers from every micro-batch chunk's dispatchers
  // (training's forwards), and its EP group moves the experts of its own layers.
  std::unique_ptr<TrainRebalancer> rebalancer;
  if (ep) {
    TrainRebalancer::LayerExpertTokens stage_tokens;
    if (pp) {
      stage_tokens = [&ep](int layer) { return ep->take_view_expert_tokens(layer); };
    } else {
      stage_tokens = tensor_parallel_expert_tokens(model, tp.get(), expert_token_split);
    }
    rebalancer =
        std::make_unique<TrainRebalancer>(options.rebalance, *ep, all, model, *learner.optimizer,
                                          learner.reference.get(), trace, std::move(stage_tokens));
    dir.log("%s", rebalancer->describe().c_str());
  }
  Arena& device = policy.device->memory();
  std::unique_ptr<Arena> host_memory;
  std::unique_ptr<TrainingOffload> offload;
  if (options.offload) {
    // Pinned next to a CUDA device: the moments move by DMA at full link speed.
    host_memory = std::make_unique<Arena>("host memory (offload)",
                                          TrainingOffload::host_bytes(model.parameter_count()),
                                          policy.device->host_memory_kind());
    offload = std::make_unique<TrainingOffload>(model, *learner.optimizer, *learner.gradients_mark,
                                                *host_memory);
    dir.log(
        "# offload: %s of gradients and optimizer state leave device memory during every "
        "generation phase\n",
        format_bytes(offload->device_bytes()).c_str());
  }
  size_t generation_peak = 0, training_peak = 0;
  // Bytes this rank received in the model-parallel layout switches of the run (PP or TP).
  uint64_t generation_switch_bytes = 0;
  // Generation inside the pipelines without StaleSync's pools: the decode steps of the groups
  // whose last stage this rank is (their messages follow them; summary.json's sum).
  int64_t group_decode_steps = 0;
  // With StaleSync's pools: this rank's pool's steps begun and their decode rows, prefill sequences
  // and prefill tokens (inside the pipelines its lane's messages follow them; summary.json's sums
  // by the lane owner's stage).
  long long lane_counts[4] = {0, 0, 0, 0};
  // With tensor parallelism the replicas' data-parallel groups sum the gradients and the step's
  // statistics (the ranks of a TP group hold the same samples).
  // With pipeline parallelism, the ranks holding the same stage (one per pipeline).
  const DataParallelHooks data_parallel_hooks = learner_hooks(
      pp ? pp->data_parallel() : (tp ? tp->data_parallel() : all), links, model, ep.get(), trace);
  // --reorder-samples (refused with TP and PP): the ranks move the samples they generated between
  // them before training.
  std::unique_ptr<SampleReordering> reordering;
  const ReorderCosts reorder_costs = parse_reorder_costs(options.reorder_samples);
  if (reorder_costs != ReorderCosts::Off) {
    reordering = std::make_unique<SampleReordering>(reorder_costs, policy.config, all.comm, links,
                                                    trace, rl.log_every);
    dir.log("%s", reordering->describe().c_str());
  }
  const DataParallelHooks parallel =
      reordering ? reordering->timed(data_parallel_hooks) : data_parallel_hooks;
  RlStepSettings settings = step_settings(rl);
  // A pipeline trains its replica's blocks together (its stages', with TP every TP rank's of them):
  // each minibatch takes its share of every block.
  // (StaleSync: the ranks' blocks differ, and one minibatch takes them all.)
  if (pp && rl.staleness == 0) settings.sample_blocks = pp->model_parallel().size();
  // (StaleSync with several minibatches: a forward-only pass over the policy's stages attaches the
  // proximal log-probs before training, whose own attach would need the whole policy on a rank.)
  settings.proximal_attached = pp != nullptr;
  const GenerationSettings sampling = sampling_settings(rl, task, run.seed);
  const AdvantageEstimator estimator = parse_advantage_estimator(rl.advantage);
  // The prompts this rank generates (with TP generation, its TP group's) per step.
  const int my_prompts = rl.prompts / replicas;
  // A generation layout of its own: before each generation phase the switch builds a view of
  // this rank's generation shard over the training parameters, receiving the experts it lacks into
  // slots of a pool that the phase's end gives back.
  std::unique_ptr<ExpertLayoutSwitch> layout_switch;
  std::unique_ptr<RoleExpertParallel> generation_ep;
  if (switch_layouts) {
    // With pipelines the switch starts from the whole model the pipeline's switch gathers (every
    // layer with the pipeline's experts), over the stage-major order, in which the training EP
    // groups are consecutive ranks as the switch expects; the generation EP groups are too.
    const HierarchicalComm& switch_ranks = pp ? pp->stage_major() : all;
    layout_switch = std::make_unique<ExpertLayoutSwitch>(
        switch_ranks, links, policy.config, options.expert_parallel, generation_degree, redundant);
    // After migrations training keeps experts (and their replicas) where the rebalancer put them.
    if (ep) layout_switch->follow_slot_experts(&ep->slot_experts());
    if (generation_degree > 1) {
      generation_ep = std::make_unique<RoleExpertParallel>(switch_ranks, links, experts,
                                                           generation_degree, options.ep_dispatch);
      // With rebalancing, generation's experts are placed by load too (place_generation).
      layout_switch->follow_generation_slots(&generation_ep->slot_experts());
    }
  }

  dir.log(
      "# RL: %d steps x %d prompts x %d samples on %d fused ranks (each generates %d and trains "
      "%d prompts per step)\n",
      rl.steps, rl.prompts, rl.group_size, ranks, my_prompts, trained_prompts);
  if (switch_layouts) {
    dir.log(
        "# layout switch: training EP %d, generation EP %d (experts moved rank to rank before "
        "each generation phase: %d expert buckets of %s into slots, %s per rank%s)\n",
        options.expert_parallel, generation_degree, layout_switch->buckets_to_receive(),
        format_bytes(layout_switch->bucket_bytes()).c_str(),
        format_bytes(layout_switch->minimum_bytes()).c_str(),
        options.rebalance.every > 0
            ? ", at the starting placement: after migrations, the experts this rank's training "
              "EP rank lacks, found by id through the placement"
            : "");
  }
  if (tp) {
    dir.log(
        "# tensor parallelism: TP %d x %d replicas%s (%s), routed experts %s; this rank stores "
        "%lld of %lld parameters\n",
        tp->degree(), tp->replicas(), pp ? " (the stages of the pipelines below)" : "",
        tp->attention_only() ? "attention heads" : "attention heads and the shared expert",
        expert_token_split ? "on each TP rank's share of its group's tokens (token split)"
                           : "on all of its group's tokens on every TP rank (duplicated)",
        (long long)model.parameter_count(), (long long)ParameterLayout(policy.config).total());
  }
  if (sliced_generation) {
    dir.log(
        "# layout switch: training data-parallel on all %d ranks, generation at TP %d on %d TP "
        "groups (--actor-tensor-parallel%s): each rank cuts its generation slice (%lld of %lld "
        "parameters) from its own model, nothing received\n",
        ranks, generation_tp, replicas,
        ep ? ", each group the ranks holding one expert block, generating over the training EP "
             "groups"
           : "",
        (long long)whole_generation_layout.total(), (long long)model.parameter_count());
  }
  // A pipeline's samples reach its stages through DistQueue (one leader per pipeline asks).
  std::unique_ptr<DistQueue> pipeline_queue;
  std::unique_ptr<PipelineTrainer> pipeline_trainer;
  MinibatchGradient pipeline_gradient;
  if (pp) {
    pipeline_queue = std::make_unique<DistQueue>(MPI_COMM_WORLD, topology,
                                                 DistQueueConfig{options.shard_capacity});
    pipeline_trainer = std::make_unique<PipelineTrainer>(
        *pp, model, settings, pipeline_rank_samples, options.micro_batches > 0,
        2 + task.max_prompt_chars() + task.max_response_chars(), ep.get(),
        options.ep_overlap_chunks, options.pipeline_pairing);
    pipeline_gradient = [&](const std::vector<const Rollout*>& minibatch, double normalizer,
                            double all_samples) {
      return pipeline_trainer->minibatch_gradient(minibatch, normalizer, all_samples);
    };
    const PipelineShape& shape = pp->shape();
    const std::string borrowed = format_bytes(
        size_t(whole_generation_layout.total() - model.parameter_count()) * sizeof(float));
    const std::string generation =
        pipeline_generates
            ? "generation inside the " + std::to_string(pp->replicas()) +
                  " pipelines (--actor-pipeline-parallel " + std::to_string(shape.stages) +
                  "), each stage from its own layers" +
                  (generation_tp_groups
                       ? " (its TP group's slices at TP " + std::to_string(generation_tp) + ")"
                       : "") +
                  (ep ? ", its experts dispatched over its EP " +
                            std::to_string(options.expert_parallel) + " group"
                      : "") +
                  ", nothing borrowed"
        : generation_tp_groups
            ? "generation at TP " + std::to_string(generation_tp) + " on " +
                  std::to_string(replicas) +
                  " TP groups (--actor-tensor-parallel), each rank borrowing its generation TP "
                  "slice of the other stages (" +
                  borrowed + (tp_generates ? ")" : ", and of its own from its TP mates)")
            : "generation data-parallel on all " + std::to_string(ranks) +
                  " ranks, each borrowing the rest of the model (" + borrowed +
                  ": other stages' layers, other TP ranks' slices)";
    dir.log(
        "# pipeline parallelism: PP %d x %d pipelines, %s, %d micro-batches per step, %d virtual "
        "stage(s) per rank (bubble formula %.1f%%), layers per chunk %s (--pipeline-balance %s); "
        "%s per phase; this rank stores %lld of %lld parameters\n",
        shape.stages, pp->replicas(), schedule_name(shape).c_str(), shape.micro_batches,
        shape.virtual_stages, 100.0 * bubble_formula(shape),
        layers_per_chunk(pp->boundaries()).c_str(), options.pipeline_balance.c_str(),
        generation.c_str(), (long long)model.parameter_count(),
        (long long)ParameterLayout(policy.config).total());
  }
  if (ep) {
    dir.log(
        "# expert parallelism: EP %d x %d replicas%s, %s dispatch, training's experts in %d "
        "overlap chunk(s), %d redundant expert slot(s) per EP rank; this rank stores %lld of "
        "%lld parameters\n",
        options.expert_parallel, ep->expert_data_group().size(),
        pp && tp ? (expert_token_split
                        ? " (EP groups: the ranks of one TP rank and stage in consecutive model "
                          "replicas, each TP rank dispatching its share of the group's tokens; "
                          "generation on them too)"
                        : " (EP groups: the ranks of one TP rank and stage in consecutive model "
                          "replicas, computing the TP group's tokens on each; generation on them "
                          "too)")
        : pp     ? " (EP groups: a stage's ranks in consecutive pipelines; generation on them too)"
        : tp     ? (expert_token_split
                        ? " (EP groups: the ranks of one TP rank in consecutive TP groups, each "
                          "expert on every rank of its TP group, each TP rank dispatching its share "
                          "of the group's tokens; generation on them too)"
                        : " (EP groups: the ranks of one TP rank in consecutive TP groups, each "
                          "expert on every rank of its TP group, computing the group's tokens on "
                          "each; generation on them too)")
                 : "",
        dispatch_mode_name(options.ep_dispatch), options.ep_overlap_chunks, redundant,
        (long long)model.parameter_count(), (long long)ParameterLayout(policy.config).total());
  }
  // StaleSync: this rank's samples live in a pool across generation phases. A phase ends at the
  // long-tail cut; unfinished samples continue in the next phase under newer weights, and each
  // step trains the groups that have finished (docs/STALESYNC.md).
  std::unique_ptr<RolloutPool> pool;
  PoolSettings pool_settings;
  const StalePolicy stale_policy =
      rl.stale_policy == "drop" ? StalePolicy::Drop : StalePolicy::Regenerate;
  // With TP the ranks of a TP group hold alike pools (the same prompts, tokens sampled from the
  // same logits by sample id) and so decide alike: every prefill and decode is collective over it.
  if (rl.staleness > 0) {
    pool = std::make_unique<RolloutPool>(task, rl.group_size, estimator);
    pool->set_learned_reward(rollout_reward(learned));
    // As many KV cache slots as the synchronous batch (the memory plan's): carried partials and
    // new prompts beyond that wait for a slot (continuous batching).
    pool_settings.slots = my_prompts * rl.group_size;
    pool_settings.finish_threshold = rl.finish_threshold;
    // Ranks end their phases together: one that is ready keeps decoding the next step's prompts
    // until the slowest is, instead of waiting for it before training.
    pool_settings.all_ranks_ready = [](bool ready) {
      int all = ready ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
      return all != 0;
    };
    dir.log(
        "# StaleSync: bound %d, a generation phase ends once %.0f%% of its samples have finished "
        "(%d KV cache slots, continuous batching with the next step's prompts filling freed "
        "slots); unfinished samples resume in the next phase; samples past the bound are %s\n",
        rl.staleness, 100.0 * rl.finish_threshold, pool_settings.slots,
        stale_policy == StalePolicy::Drop ? "dropped with their group" : "regenerated");
  }
  // After the pool exists: a StaleSync checkpoint refills it with the samples in flight.
  saved.attach_pool(pool.get());
  saved.attach_pipeline(pp.get());
  saved.attach_tensor_parallel(tp.get());
  saved.attach_rebalancer(rebalancer.get());
  if (saved.resuming()) {
    position = saved.load(state, ep.get());
    dir.log("%s", position.placement_note.c_str());
  }
  RandomDelay random_delay(rl.random_delay_ms, run.seed, rank);
  RlProgress progress(dir, rl.steps, rl.log_every, policy.device->memory());
  // A pipeline stage trains in activation arenas of its own (PipelineStage), device memory beside
  // the device arena that the fit check counts with the training state: the peaks add them.
  const auto stage_activations = [&pipeline_trainer] {
    return pipeline_trainer ? pipeline_trainer->activation_bytes_held() : size_t(0);
  };
  if (pipeline_trainer) progress.count_outside_arena(stage_activations);
  // The warm start (SFT, evaluation) takes a different time on every rank: RL starts together,
  // so its first wait is not counted as RL idle time.
  MPI_Barrier(MPI_COMM_WORLD);
  progress.start();
  saved.watch_signals();
  bool stopped = false;
  for (int step = position.step + 1; step <= rl.steps && !stopped; ++step) {
    const int version = step - 1;
    learner.optimizer->hyper().learning_rate =
        cosine_learning_rate(rl.learning_rate, step, rl.warmup_steps, rl.steps, 1.0f);
    const int64_t first_prompt = int64_t(version) * rl.prompts + int64_t(replica) * my_prompts;
    std::vector<Rollout> rollouts;
    random_delay();
    auto generate = [&](Transformer<float>& generator) {
      TraceScope traced(trace, Phase::Generate);
      traced.set_version(version);
      // (Only a pipeline's generation sends rows of its own; EP and TP count their messages
      // under their kinds.)
      const TrafficScope traffic(links, TrafficKind::PipelineGeneration);
      BatchOccupancy occupancy;
      int64_t generated = 0;  // response tokens drawn
      if (pool) {
        // Continuous batching with one step of lookahead: the next step's prompts are in the
        // pool too, and fill the slots this step's finished samples free (the phase's own work
        // is this step's prompts and the partials carried in).
        if (step == 1) pool->add_prompts(first_prompt, my_prompts);
        if (step < rl.steps) pool->add_prompts(first_prompt + rl.prompts, my_prompts);
        pool_settings.count_prompts_below = first_prompt + rl.prompts;
        // Trained at this version, a sample may be at most `staleness` versions old.
        pool->enforce_staleness(version - rl.staleness, stale_policy);
        // Partials already carried `staleness` times finish in this phase.
        pool_settings.finish_older_than = version - rl.staleness + 1;
        // Inside the pipeline each rank's pool is a lane whose logits the stages compute; the
        // ranks agree on each phase's end by a nonblocking allreduce instead of the hook.
        PoolSettings in_pipeline = pool_settings;
        in_pipeline.all_ranks_ready = nullptr;
        const PhaseStats phase =
            pipeline_generates ? generate_phase_pipelined(
                                     *pool, generator, pp->chunks(pp->stage()), sampling, version,
                                     in_pipeline, MPI_COMM_WORLD, pp->pipeline().comm, links)
                               : pool->generate_phase(generator, sampling, version, pool_settings);
        rollouts = pool->take_complete_groups();
        generated = phase.generated_tokens;
        occupancy = phase.occupancy;
        lane_counts[0] += phase.steps_begun;
        lane_counts[1] += phase.decode_rows;
        lane_counts[2] += phase.prefill_sequences;
        lane_counts[3] += phase.prefill_tokens;
      } else if (pipeline_generates) {
        // The pipeline's ranks draw their samples together, each stage running its own layers.
        const SampleGenerator in_pipeline = [&](const std::vector<std::vector<int>>& prompts,
                                                const std::vector<int64_t>& sample_ids,
                                                BatchOccupancy* steps) {
          return generate_own_prompts_pipelined(generator, pp->chunks(pp->stage()), prompts,
                                                sample_ids, sampling, pp->pipeline().comm, links,
                                                steps);
        };
        rollouts = generate_rollouts(in_pipeline, task, first_prompt, my_prompts, rl.group_size,
                                     version, estimator, rollout_reward(learned), &occupancy);
      } else {
        rollouts =
            generate_rollouts(generator, task, first_prompt, my_prompts, rl.group_size, sampling,
                              version, estimator, rollout_reward(learned), &occupancy);
      }
      if (!pool) {
        for (const Rollout& r : rollouts) generated += int64_t(r.response.size());
      }
      // The ranks of a generation TP group draw the same samples: each counts its share, so that
      // the trace counts every token once.
      if (generation_tp_groups) {
        const TensorSlice& slice = generation_tp_groups->slice();
        generated = tensor_parallel_row_share(int(generated), slice.size, slice.rank).count;
      }
      traced.add_tokens(generated);
      // (With TP inside the stages every TP rank of the last stage takes the steps: one counts.)
      if (!tp || tp->rank() == 0) group_decode_steps += occupancy.group_decode_steps;
      // The long-tail bubble (the unused share of the decode steps' time, generation.h) as an
      // Idle event nested at the end of the phase, where the tail is.
      const double end = trace.now();
      trace.record(Phase::Idle, end - occupancy.bubble_seconds, end, 0, 0, version);
    };
    // Generation at the generation EP layout of its own (--actor-expert-parallel) over the
    // experts `training` stores: the ones its generation shard lacks are received into slots of a
    // pool given back after the phase (inside the caller's arena scope). Returns the bytes
    // received.
    auto generate_switched = [&](Transformer<float>& training) {
      SlotPool received(device, layout_switch->bucket_bytes(), layout_switch->buckets_to_receive(),
                        "received expert buckets");
      GenerationExperts generation_experts;
      {
        TraceScope traced(trace, Phase::Reshard);
        const TrafficScope traffic(links, TrafficKind::LayoutSwitch);
        traced.set_version(version);
        generation_experts = layout_switch->to_generation(training.experts(), received);
        traced.set_bytes(int64_t(generation_experts.received_bytes));
      }
      Transformer<float> generation(training, generation_experts.table);
      if (generation_ep) generation_ep->attach_reusing(generation);
      generate(generation);
      layout_switch->to_training(generation_experts, received);
      return generation_experts.received_bytes;
    };
    if (offload) {
      TraceScope traced(trace, Phase::Offload);
      traced.set_version(version);
      traced.set_bytes(int64_t(offload->offload()));
    }
    device.start_phase_peak();
    const auto generation_start = std::chrono::steady_clock::now();
    try {
      if (pipeline_generates) {
        // Inside the training pipelines, from the stage's own layers: nothing borrowed. (With TP
        // from the stage's slices, over its TP group: each rank then keeps its share of the
        // group's samples, the block the data-parallel layout gives it.)
        generate(model);
        if (generation_tp_groups) {
          rollouts =
              tensor_parallel_share(std::move(rollouts), *generation_tp_groups, rl.group_size);
        }
      } else if (pp) {
        // The borrowed layers live in the device arena only for this phase (the scope is declared
        // first, so the borrowed model is gone before the arena rewinds); the stage is only read.
        // With EP the whole model holds the pipeline's experts only and generates collectively
        // over the training EP groups (its own dispatchers, made once).
        // With TP generation the whole model is this rank's generation TP slice of every layer,
        // generating collectively over its generation TP group; each rank then keeps its share of
        // the group's samples: exactly the block the data-parallel layout gives it.
        ArenaScope generation_memory(device);
        // The other stages' layers (or, copying, every layer) received into `target`.
        auto gather_into = [&](Transformer<float>& target) {
          TraceScope traced(trace, Phase::Reshard);
          const TrafficScope traffic(links, TrafficKind::LayoutSwitch);
          traced.set_version(version);
          const uint64_t received =
              gather_pipeline_model(model.parameters(), *pp, target.parameters(), target.layout());
          traced.set_bytes(int64_t(received));
          generation_switch_bytes += received;
        };
        if (stitched_generation) {
          // Only the other stages' layers received (with TP, the rank's slice of them): the
          // stage generates from a stitched view of them and its own layers.
          Transformer<float> borrowed(policy.config, policy.device->ops(), device,
                                      /*with_gradients=*/false, pp->expert_shard(), other_stages,
                                      generation_tp_groups);
          gather_into(borrowed);
          Transformer<float> whole(model, borrowed);
          whole.set_expert_token_split(generation_token_split);
          if (layout_switch) {
            // PP x EP at a generation EP degree of its own: switched from the stitched view.
            generation_switch_bytes += generate_switched(whole);
          } else {
            if (ep) ep->attach_reusing(whole);
            generate(whole);
          }
        } else {
          Transformer<float> whole(policy.config, policy.device->ops(), device,
                                   /*with_gradients=*/false, pp->expert_shard(), LayerShard{},
                                   generation_tp_groups);
          whole.set_expert_token_split(generation_token_split);
          gather_into(whole);
          if (layout_switch) {
            // PP x EP at a generation EP degree of its own: from the gathered model.
            generation_switch_bytes += generate_switched(whole);
          } else {
            if (ep) ep->attach_reusing(whole);
            generate(whole);
          }
        }
        if (generation_tp_groups) {
          rollouts =
              tensor_parallel_share(std::move(rollouts), *generation_tp_groups, rl.group_size);
        }
      } else if (tp_regrouped_generation || sliced_generation) {
        // TP T -> TP G (1: DP), or TP 1 -> TP G: every rank generates from its generation slice
        // (G = 1: the whole model) with its generation TP group, in the device arena for the
        // phase: regrouped inside its training TP group, or cut from its own whole model
        // (nothing received). Each keeps its share (its data-parallel block); a training TP group
        // then trains the samples of all its ranks.
        ArenaScope generation_memory(device);
        // (With EP each rank keeps its training experts and generates collectively over its
        // training EP group, whose ranks are TP ranks of one place in consecutive generation
        // groups.)
        Transformer<float> generator(policy.config, policy.device->ops(), device,
                                     /*with_gradients=*/false, regrouped_experts, LayerShard{},
                                     generation_groups.get());
        generator.set_expert_token_split(generation_token_split);
        {
          TraceScope traced(trace, Phase::Reshard);
          const TrafficScope traffic(links, TrafficKind::LayoutSwitch);
          traced.set_version(version);
          uint64_t received = 0;
          if (tp) {
            received =
                regroup_tensor_slices(model.parameters(), model.layout(), generator.parameters(),
                                      generator.layout(), policy.config, *tp);
          } else {
            slice_parameters(model.parameters(), model.layout(), generator.parameters(),
                             generator.layout());
          }
          traced.set_bytes(int64_t(received));
          generation_switch_bytes += received;
        }
        if (ep) ep->attach_reusing(generator);
        generate(generator);
        if (generation_groups) {
          rollouts = tensor_parallel_share(std::move(rollouts), *generation_groups, rl.group_size);
        }
        if (tp) {
          TraceScope traced(trace, Phase::QueueGet);
          const TrafficScope traffic(links, TrafficKind::RolloutQueue);
          traced.set_version(version);
          rollouts = gather_tensor_parallel_rollouts(rollouts, *tp, rl.group_size);
        }
      } else if (!layout_switch) {
        generate(model);
      } else {
        // The received experts' slots live in the device arena only for this phase (the scope
        // is declared first, so the pool and the view are gone before the arena rewinds).
        ArenaScope generation_memory(device);
        generate_switched(model);
      }
    } catch (const OutOfDeviceMemory& error) {
      if (offload) throw;
      // Every fused rank generates the same amount, so all of them stop here with this message.
      throw OutOfDeviceMemory(std::string(error.what()) + "; --offload would free " +
                              format_bytes(3 * size_t(model.parameter_count()) * sizeof(float)) +
                              " of gradients and optimizer state during generation");
    }
    generation_peak = std::max(generation_peak, device.phase_peak());
    // The rebalancer's seconds go with the tokens it counts: generation's too when it runs on the
    // training layout (its dispatchers count), training's always.
    // (With pipeline stages only training's forwards count.)
    double routed_seconds = layout_switch || pp ? 0.0 : seconds_since(generation_start);
    if (offload) {
      TraceScope traced(trace, Phase::Onload);
      traced.set_version(version);
      traced.set_bytes(int64_t(offload->onload()));
    }
    {
      // Ranks whose generation ended first wait here for the others: idle time.
      TraceScope traced(trace, Phase::Idle);
      traced.set_version(version);
      MPI_Barrier(MPI_COMM_WORLD);
    }
    bool train = true;
    if (pool) {
      // A step in which no rank finished a whole group trains nothing (an optimizer step on no
      // data would still move the weights through AdamW's moments); its reward is NaN.
      long long groups = (long long)rollouts.size();
      MPI_Allreduce(MPI_IN_PLACE, &groups, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      if (groups == 0) {
        dir.log("# step %d: no group finished on any rank; nothing to train\n", step);
        position.step_rewards.push_back(std::nan(""));
        train = false;
      }
    }
    if (train) {
      if (reordering) rollouts = reordering->reorder(std::move(rollouts), rl.group_size, version);
      random_delay();
      if (pp) {
        TraceScope traced(trace, Phase::QueueGet);
        const TrafficScope traffic(links, TrafficKind::RolloutQueue);
        traced.set_version(version);
        if (pool) {
          // Every rank finished its own count of groups: the replica's ranks exchange them, and
          // each minibatch takes its share of every rank's block.
          std::vector<size_t> blocks;
          rollouts = gather_replica_rollouts(*pp, rollouts, rl.group_size, blocks);
          settings.block_sizes = blocks;
          pipeline_trainer->set_blocks(std::move(blocks));
        } else {
          rollouts = pipeline_rollouts(*pipeline_queue, pp->model_parallel(), rollouts,
                                       rl.group_size, pipeline_member_blocks);
        }
      }
      // Under PP the log-probs that anchor the loss come from forward-only passes over the
      // stages, on the replica's samples in the data-parallel run's micro-batches (each rank's
      // block in --micro-batch pieces); with EP inside the stages, in step with the EP mates. No
      // rank holds more of a model than its stage.
      const int longest_sequence = 2 + task.max_prompt_chars() + task.max_response_chars();
      if (pp && learner.reference) {
        TraceScope traced(trace, Phase::Reference);
        traced.set_version(version);
        traced.set_bytes(int64_t(pipeline_reference_logprobs(
            *learner.reference, *pp, rollouts, settings.block_sizes, settings.micro_batch,
            settings.temperature, longest_sequence, ep.get())));
      }
      // PP StaleSync with several minibatches: the decoupled objective's anchor for the samples
      // after each rank's first minibatch, from the policy's stages before the step trains.
      if (pp && pool && settings.minibatches > 1) {
        TraceScope traced(trace, Phase::Proximal);
        traced.set_version(version);
        traced.set_bytes(int64_t(pipeline_proximal_logprobs(model, *pp, rollouts, settings,
                                                            longest_sequence, ep.get())));
      }
      device.start_phase_peak();
      const auto training_start = std::chrono::steady_clock::now();
      // Every fused rank takes its share of the step's tokens in the trace: the stages of a
      // pipeline and the ranks of a TP group train the same samples, so their counts together
      // are the step's once (a pipeline's stages each counting its samples made `report` count
      // them P times).
      const StepStats stats = train_on_rollouts_traced(
          model, *learner.optimizer, pp ? nullptr : learner.reference.get(), rollouts, settings,
          parallel, version, TokenShare{ranks, all.rank()}, trace, pipeline_gradient);
      training_peak = std::max(training_peak, device.phase_peak() + stage_activations());
      const double training_seconds = seconds_since(training_start);
      if (reordering) dir.log("%s", reordering->end_of_step(step, training_seconds).c_str());
      routed_seconds += training_seconds;
      position.rl_tokens += int64_t(stats.tokens);
      position.step_rewards.push_back(stats.mean_reward());
      progress.step_done(step, stats);
    }
    if (rebalancer) dir.log("%s", rebalancer->end_of_step(step, routed_seconds).c_str());
    if (rebalancer && generation_ep && !pp)
      dir.log("%s", rebalancer->place_generation(step, *generation_ep).c_str());
    stopped = saved.end_of_step(step, position, progress.seconds_since_start(), state, root,
                                ep.get(), MPI_COMM_WORLD, dir);
  }
  if (stopped) return kExitCheckpointedOnSignal;
  std::string parallel_json;
  if (pp || tp || generation_groups) {
    dir.log("# layout switch of rank 0: %s received over the run (generation at TP %d)\n",
            format_bytes(size_t(generation_switch_bytes)).c_str(), generation_tp);
    parallel_json = "\"actor_tensor_parallel\":" + std::to_string(generation_tp) +
                    ",\"generation_switch_bytes\":" + std::to_string(generation_switch_bytes) + ",";
  }
  if (pp) {
    // Requests the shards served: every pipeline's leader asked once per shard and step.
    DistQueueCounters served = pipeline_queue->counters();
    pipeline_queue->close();
    unsigned long long totals[2] = {served.get_requests, served.reply_bytes};
    MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    const double bubble = pipeline_trainer->measured_bubble();
    const double formula = bubble_formula(pp->shape());
    dir.log(
        "# pipeline training steps of rank 0: %.3f s wall, %.3f s compute, %.3f s waiting: "
        "measured bubble %.1f%% (formula (p-1)/(mv+p-1) %.1f%%); DistQueue served %llu get "
        "requests, %llu reply bytes (one leader per model replica: %d ranks)\n",
        pipeline_trainer->wall_seconds(), pipeline_trainer->compute_seconds(),
        pipeline_trainer->wait_seconds(), 100.0 * bubble, 100.0 * formula, totals[0], totals[1],
        pp->model_parallel().size());
    // The stage activation arenas' use against the fit check's count, the busiest rank's each.
    unsigned long long activations[2] = {pipeline_trainer->activation_bytes_held(),
                                         memory_plan.pipeline_activations};
    MPI_Allreduce(MPI_IN_PLACE, activations, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    dir.log(
        "# pipeline activation arenas (micro-batch chunks in flight x the largest use), busiest "
        "rank: %s measured, %s counted by the fit check\n",
        format_bytes(activations[0]).c_str(), format_bytes(activations[1]).c_str());
    char fields[512];
    std::snprintf(fields, sizeof fields,
                  "\"pipeline_parallel\":%d,\"virtual_stages\":%d,\"micro_batches\":%d,"
                  "\"pipeline_bubble\":%.4f,\"pipeline_bubble_formula\":%.4f,"
                  "\"queue_get_requests\":%llu,\"queue_reply_bytes\":%llu,"
                  "\"queue_replica_ranks\":%d,\"pipeline_activation_bytes\":%llu,"
                  "\"pipeline_activation_bytes_analytic\":%llu,",
                  pp->shape().stages, pp->shape().virtual_stages, pp->shape().micro_batches, bubble,
                  formula, totals[0], totals[1], pp->model_parallel().size(), activations[0],
                  activations[1]);
    parallel_json += fields;
    if (pipeline_generates && !pool) {
      long long steps = group_decode_steps;
      MPI_Allreduce(MPI_IN_PLACE, &steps, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      dir.log("# generation inside the pipelines: %lld decode steps of their groups in all\n",
              steps);
      parallel_json += "\"pipeline_decode_steps\":" + std::to_string(steps) + ",";
    }
    if (pipeline_generates && pool) {
      // Every rank's lane, summed over the pipelines (and TP ranks) by its stage: steps, decode
      // rows, prefill sequences, prefill tokens.
      const int stages = pp->shape().stages;
      std::vector<long long> lanes(size_t(4 * stages), 0);
      std::copy(lane_counts, lane_counts + 4, lanes.begin() + 4 * pp->stage());
      MPI_Allreduce(MPI_IN_PLACE, lanes.data(), int(lanes.size()), MPI_LONG_LONG, MPI_SUM,
                    MPI_COMM_WORLD);
      std::string list;
      for (const long long count : lanes) {
        if (!list.empty()) list += ',';
        list += std::to_string(count);
      }
      dir.log(
          "# StaleSync's lanes inside the pipelines, by stage (steps, decode rows, prefill "
          "sequences, prefill tokens): %s\n",
          list.c_str());
      parallel_json += "\"pipeline_lanes\":[" + list + "],";
    }
    if (ep && rl.staleness > 0) {
      // StaleSync with EP: the empty micro-batches that kept the pipelines in step with their EP
      // mates, over all ranks.
      long long padded = pipeline_trainer->padded_micro_batches();
      MPI_Allreduce(MPI_IN_PLACE, &padded, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      dir.log(
          "# StaleSync at PP x EP: the ranks ran %lld empty micro-batch(es) in all to keep in step "
          "with their EP mates\n",
          padded);
      parallel_json += "\"pipeline_padded_micro_batches\":" + std::to_string(padded) + ",";
    }
    parallel_json +=
        pipeline_stage_report(*pp, options.pipeline_balance, pipeline_trainer->compute_seconds(),
                              pipeline_trainer->wall_seconds(), dir);
    if (ep) {
      parallel_json +=
          pipeline_ep_overlap_report(pipeline_trainer->ep_communication(),
                                     options.ep_overlap_chunks, pipeline_trainer->pairs(), dir);
    }
  }
  if (pool) {
    // Rank 0's pool (each rank has its own; the counters of the others are alike).
    const PoolCounters& c = pool->counters();
    dir.log(
        "# StaleSync pool of rank 0: %lld samples cut and resumed later, %lld prefix tokens "
        "recomputed, %lld regenerated, %lld groups dropped; %zu samples still in flight at the "
        "end (not trained)\n",
        (long long)c.cut_samples, (long long)c.recomputed_prefix_tokens,
        (long long)c.regenerated_samples, (long long)c.dropped_groups, pool->in_flight_samples());
    // The rows the pools' steps ran (decode rows and prefill tokens), over every rank: the pools
    // generate ahead, so generation's TP collectives follow these rather than the trained rows
    // (a generation TP group's ranks run alike pools: G times the group's).
    long long rows = lane_counts[1] + lane_counts[3];
    MPI_Allreduce(MPI_IN_PLACE, &rows, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    parallel_json += "\"pool_generation_rows\":" + std::to_string(rows) + ",";
  }
  if (ep) {
    parallel_json +=
        expert_rows_report(ep->traffic().expert_rows, tp.get(), expert_token_split, dir);
  } else if (tp && tp_generates && !pp) {
    // TP alone, generating on the training slices: the rows the policy (and its views) and the
    // reference computed on this rank's own experts.
    const int64_t rows = model.local_routed_rows() +
                         (learner.reference ? learner.reference->local_routed_rows() : 0);
    parallel_json += expert_rows_report(rows, tp.get(), expert_token_split, dir);
  }
  if (!pp && (ep || generation_ep)) {
    // (A PP x EP run reported its schedule's exchanges above.)
    SplitPhaseChain::Time exchanges;
    for (const RoleExpertParallel* layout : {ep.get(), generation_ep.get()}) {
      if (!layout) continue;
      exchanges.in_flight += layout->communication_time().in_flight;
      exchanges.exposed += layout->communication_time().exposed;
    }
    parallel_json += ep_exchange_report(exchanges, progress.seconds_since_start(), dir);
  }
  if (reordering) dir.log("%s", reordering->summary().c_str());
  dir.log(
      "# device memory peaks of learner 0: generation %s (analytic %s), training %s (analytic %s), "
      "capacity %s\n",
      format_bytes(generation_peak).c_str(), format_bytes(memory_plan.generation_peak()).c_str(),
      format_bytes(training_peak).c_str(), format_bytes(memory_plan.training_peak()).c_str(),
      format_bytes(device.capacity()).c_str());

  MultiRankTrainEnd end;
  end.mode = mode;
  end.learner = true;
  end.root = root;
  end.ep = ep.get();
  end.tensor_parallel = tp.get();
  end.pipeline = pp.get();
  end.before_rl = position.before_rl;
  end.rl_seconds = position.rl_seconds + progress.seconds_since_start();
  end.rl_tokens = position.rl_tokens;
  end.run_start = run_start;
  end.memory_json = device_memory_json(generation_peak, training_peak, memory_plan) +
                    parallel_json + (reordering ? reordering->summary_json() : "");
  end.migrations = rebalancer ? rebalancer->migrations() : 0;
  return finish_multi_rank_train(end, run, policy_options, sft, rl, options, policy, topology, dir,
                                 trace, result);
}

}  // namespace rlf
