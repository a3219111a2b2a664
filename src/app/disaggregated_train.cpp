#include "src/app/disaggregated_train.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <span>

#include "kernels/error.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "mpi_comm/wait_policy.h"
#include "src/app/build_info.h"
#include "src/app/disaggregated_tensor_parallel.h"
#include "src/app/ep_exchange_report.h"
#include "src/app/learned_reward.h"
#include "src/app/learner_hooks.h"
#include "src/app/learner_setup.h"
#include "src/app/random_delay.h"
#include "src/app/rl_progress.h"
#include "src/app/sample_reordering.h"
#include "src/app/traced_training.h"
#include "src/app/train_finish.h"
#include "src/io/parameter_file.h"
#include "src/io/run_directory.h"
#include "src/io/trace.h"
#include "src/io/trace_writer.h"
#include "src/model/expert_parallel.h"
#include "src/model/lr_schedule.h"
#include "src/model/optimizer.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/rl/tokenizer.h"
#include "src/roles/dist_queue.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_packing.h"
#include "src/runtime/expert_weight_sync.h"
#include "src/runtime/posted_weight_sync.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/weight_sync.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

// `replicas`: the learners' model replicas (with TP the TP groups), each taking its share.
void validate_layout_fit(const RlOptions& rl, const Topology& topology, int replicas) {
  const int learners = int(topology.ranks_of(Role::Learner).size());
  const int64_t batch = int64_t(rl.prompts) * rl.group_size;
  if (batch % replicas != 0) {
    throw ConfigError("--prompts x --group-size = " + std::to_string(batch) +
                      " samples per step must divide evenly among " + std::to_string(replicas) +
                      (replicas == learners ? " learner ranks" : " learner TP groups"));
  }
  if (topology.ranks_of(Role::Actor).empty()) {
    throw ConfigError("a multi-rank train needs at least one actor rank (see --actors)");
  }
}

// The contiguous block of the step's prompts actor `index` of `actors` generates.
std::pair<int64_t, int> actor_prompts(int64_t first_prompt, int prompts, int index, int actors) {
  const int begin = int(int64_t(prompts) * index / actors);
  const int end = int(int64_t(prompts) * (index + 1) / actors);
  return {first_prompt + begin, end - begin};
}

int index_in(const std::vector<int>& ranks, int world_rank) {
  return int(std::find(ranks.begin(), ranks.end(), world_rank) - ranks.begin());
}

// Completes nonblocking MPI requests while serving the queue shards this rank hosts: a learner
// blocked in a plain collective could not answer another learner still collecting its batch.
void serve_until_complete(std::span<MPI_Request> requests, DistQueue& queue) {
  queue.serve_until([&] {
    int done = 0;
    MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  });
}

// Waits for every rank of `comm` while serving the queue shards this rank hosts.
void serving_barrier(MPI_Comm comm, DistQueue& queue) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  serve_until_complete(std::span(&request, 1), queue);
}

// StaleSync's schedule in disaggregated mode (docs/STALESYNC.md). With a bound s >= 1 actors run
// L = s steps ahead: batch k is generated with version k - 1 - L while learners train batch
// k - L, and a learner trains batch k at version v = k - 1, so its oldest token is v - L = v - s:
// the deepest lag the bound allows. (A lag of steps - 1 already generates every batch with
// version 0, so L stops there.) The versions are fixed by the step number, never by timing, so a
// seed fixes the run. s = 0 is the synchronous schedule: batch k from version k - 1, weights sent
// after every step.
struct StaleSchedule {
  int lag = 0;    // steps the actors run ahead
  int steps = 0;  // RL steps of the run

  static StaleSchedule of(int staleness, int steps) {
    return {staleness == 0 ? 0 : std::max(1, std::min(staleness, steps - 1)), steps};
  }
  int generation_version(int step) const { return std::max(0, step - 1 - lag); }
  // Learners send version step - 1 once they have taken batch `step` (their parameters are that
  // version then); actors receive it before generating batch step + lag, the first that needs
  // it. Version 0 comes with the first sync, and nothing needs a version after batch `steps`.
  bool pipelined_sync_after(int step) const { return lag >= 1 && step >= 2 && step + lag <= steps; }
};

// Actors put `lag` batches ahead before they agree to the learners' end of a step, and the
// learners take the next batch only after it: every shard must hold its share of `lag` batches,
// or the run would wait forever. Modulo sharding puts at most ceil(n / shards) of n consecutive
// sample ids in one shard.
void validate_queue_holds_pipeline(const RlOptions& rl, int lag, int shards, int64_t capacity) {
  const int64_t samples = int64_t(lag) * rl.prompts * rl.group_size;
  const int64_t per_shard = (samples + shards - 1) / shards;
  if (per_shard > capacity) {
    throw ConfigError("--queue-capacity " + std::to_string(capacity) + " is too small for " +
                      "--staleness " + std::to_string(rl.staleness) + ": the actors put " +
                      std::to_string(lag) + " batch(es) ahead, up to " + std::to_string(per_shard) +
                      " samples in one of the " + std::to_string(shards) +
                      " DistQueue shards; use --queue-capacity >= " + std::to_string(per_shard));
  }
}

// StaleSync actors keep the batches they put until the learners have agreed to the end of the
// step before them: a checkpoint of that step holds them (they are in DistQueue, not trained).
class QueuedBatches {
 public:
  void add(int step, std::vector<InFlightSample> samples) {
    batches_.emplace_back(step, std::move(samples));
  }
  // The batches after `step`, in step order; forgets the others (trained by then).
  std::vector<InFlightSample> after(int step) {
    while (!batches_.empty() && batches_.front().first <= step) batches_.pop_front();
    std::vector<InFlightSample> samples;
    for (const auto& [batch_step, batch] : batches_)
      samples.insert(samples.end(), batch.begin(), batch.end());
    return samples;
  }

 private:
  std::deque<std::pair<int, std::vector<InFlightSample>>> batches_;
};

// Rank 0 of each group of `size` consecutive ranks of `ranks` (TP groups: TP rank 0's ranks).
std::vector<int> first_of_each_group(const std::vector<int>& ranks, int size) {
  std::vector<int> first;
  for (size_t i = 0; i < ranks.size(); i += size_t(size)) first.push_back(ranks[i]);
  return first;
}

}  // namespace

int run_disaggregated_train(const RunOptions& run, const PolicyOptions& policy_options,
                            const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                            const DisaggregatedOptions& options, const std::string& resolved_config,
                            TrainResult* result, const CheckpointOptions& checkpoints) {
  Topology topology(MPI_COMM_WORLD, layout);
  const ModelConfig model_config = load_model_config(run.model);
  validate_role_tensor_parallel(options, model_config, int(topology.ranks_of(Role::Learner).size()),
                                int(topology.ranks_of(Role::Actor).size()));
  // Learners hold and train the model in TP groups of consecutive learner ranks (--tensor-parallel;
  // data-parallel over the groups); actors generate data-parallel, each from the whole model, or
  // in TP groups of their own (--actor-tensor-parallel).
  const int learner_replicas =
      int(topology.ranks_of(Role::Learner).size()) / options.tensor_parallel;
  validate_layout_fit(rl, topology, learner_replicas);
  const StaleSchedule schedule = StaleSchedule::of(rl.staleness, rl.steps);
  if (schedule.lag >= 1) {
    validate_queue_holds_pipeline(rl, schedule.lag, topology.queue_shards(),
                                  options.shard_capacity);
  }
  const Role role = topology.role();
  const bool root = topology.world_rank() == topology.ranks_of(Role::Learner).front();
  // Every rank checks the same inputs, so a bad value stops all of them before any work. Queue
  // ranks build the model too: loading --init is what rejects another model's checkpoint, and
  // a rank that skipped it would wait forever in the queue's collectives for the others.
  const int experts = model_config.n_experts;
  // With TP an EP group is the learners with the same TP rank in E consecutive TP groups (as in
  // fused TP x EP): the degree must fit the TP groups, checked on TP rank 0's learners.
  const int learner_tp = std::max(1, options.tensor_parallel);
  validate_role_expert_parallel("--expert-parallel", options.expert_parallel,
                                first_of_each_group(topology.ranks_of(Role::Learner), learner_tp),
                                experts, options.ep_dispatch, topology.links(),
                                learner_tp > 1 ? "learner TP group" : "learner");
  // So for actor TP groups (G consecutive actors) and their EP groups.
  const int actor_tp_degree = std::max(1, options.actor_tensor_parallel);
  validate_role_expert_parallel(
      "--actor-expert-parallel", options.actor_expert_parallel,
      first_of_each_group(topology.ranks_of(Role::Actor), actor_tp_degree), experts,
      options.ep_dispatch, topology.links(), actor_tp_degree > 1 ? "actor TP group" : "actor");
  const int redundant = options.rebalance.redundant_experts;
  if (redundant > 0) {
    validate_redundant_slots(redundant, experts, options.expert_parallel, "--redundant-experts");
  }
  // With expert parallelism a learner or actor stores only the experts it owns (a learner also
  // its spare slots for replicas).
  const int ep_degree = role == Role::Learner ? options.expert_parallel
                        : role == Role::Actor ? options.actor_expert_parallel
                                              : 1;
  // (A TP learner's or actor's EP rank is its TP group's place among the TP groups.)
  const int role_index = index_in(topology.ranks_of(role), topology.world_rank());
  const int role_tp_degree = role == Role::Learner ? learner_tp
                             : role == Role::Actor ? actor_tp_degree
                                                   : 1;
  ExpertShard own_experts = ep_degree > 1
                                ? expert_shard_of(role_index / role_tp_degree, ep_degree, experts)
                                : ExpertShard{};
  if (role == Role::Learner) own_experts.redundant = redundant;
  const std::unique_ptr<TensorParallel> role_tp =
      make_role_tensor_parallel(options, model_config, topology);
  const TensorParallel* tp = role == Role::Learner ? role_tp.get() : nullptr;  // the learners'
  const TensorParallel* actor_tp = role == Role::Actor ? role_tp.get() : nullptr;
  Policy policy =
      make_policy(run, policy_options, role == Role::Learner, own_experts, role_tp.get());
  // Synchronous checkpoints fall between steps with nothing in flight. With StaleSync the actors
  // are L batches ahead: the checkpoint of step k also holds batches k + 1 .. k + L, which every
  // actor has put before it agrees to step k's end (and no learner has taken).
  const int compute_rank_count =
      int(topology.ranks_of(Role::Learner).size() + topology.ranks_of(Role::Actor).size());
  TrainCheckpoints saved(checkpoints, run, rl, policy.config, /*supported=*/true,
                         compute_rank_count);
  if (rl.staleness > 0) saved.collect_in_flight();
  // A TP learner's state is its slice; checkpoints hold the whole model, gathered by TP group 0.
  saved.attach_tensor_parallel(tp);
  RunDirectory dir(run.run_dir, resolved_config, /*writer=*/root, saved.resuming());
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&policy.device->memory());
  DistQueueConfig queue_config;
  queue_config.shard_capacity = options.shard_capacity;
  DistQueue queue(MPI_COMM_WORLD, topology, queue_config);
  // Actor TP groups receive only their TP slices: a broadcast (or posted sends) per actor TP rank
  // of the model (with EP, of its replicated tensors; the experts are whole on every TP rank).
  const bool expert_sync = options.expert_parallel > 1 || options.actor_expert_parallel > 1;
  WeightSync weights(MPI_COMM_WORLD, topology, actor_tp_degree);
  // StaleSync's pipelined weight sync waits on a barrier of the ranks that generate or train.
  MPI_Comm compute_ranks = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, role == Role::Queue ? MPI_UNDEFINED : 0, topology.world_rank(),
                 &compute_ranks);
  // Deeper pipelines: learner 0 posts versions without waiting for the actors.
  std::unique_ptr<PostedWeightSync> posted_weights;
  if (schedule.lag >= 2)
    posted_weights = std::make_unique<PostedWeightSync>(weights, topology.links());
  RandomDelay random_delay(rl.random_delay_ms, run.seed, topology.world_rank());
  std::unique_ptr<ExpertWeightSync> expert_weights;
  if (expert_sync) {
    expert_weights = std::make_unique<ExpertWeightSync>(
        MPI_COMM_WORLD, topology, experts, options.expert_parallel, options.actor_expert_parallel,
        redundant, learner_tp, actor_tp_degree);
  }

  dir.log("# rlfusion train (disaggregated, %s): %s\n",
          rl.staleness > 0 ? "StaleSync" : "synchronous", build_info().c_str());
  dir.log("# model %s (%.2fM parameters), task %s, seed %llu, run dir %s\n",
          policy.config.name.c_str(), policy.config.parameter_count() / 1e6,
          policy.task->name().c_str(), (unsigned long long)run.seed, dir.path().c_str());
  dir.log("%s", topology.layout_table().c_str());
  dir.log("# %s\n", describe_wait_policy().c_str());
  dir.log("%s", describe_router_skew(options.rebalance).c_str());
  saved.describe(dir);

  Transformer<float>& model = *policy.model;
  const Task& task = *policy.task;
  const int64_t parameter_count = model.parameter_count();
  // The weight sync sends the whole model: with TP, TP group 0 assembles it on learner 0 first.
  WholeModelForSync sync_model(tp, policy.config, model.layout());
  const ParameterLayout whole_layout(policy.config);
  const int64_t synced_count = tp ? whole_layout.total() : parameter_count;
  // An actor in a TP group receives its slice straight into its model: without EP learner 0 cuts
  // the whole model for each actor TP rank (ActorSlicesForSync), with EP its replicated tensors
  // (replicated_actor_slices).
  const bool sliced_sync = actor_tp_degree > 1 && !expert_sync;
  ActorSlicesForSync actor_slices_for_sync(sliced_sync && root ? actor_tp_degree : 0, policy.config,
                                           options.tensor_parallel_attention_only);
  const bool learner_sends_weights =
      role == Role::Learner && (root || expert_weights || (tp && sync_model.assembles()));
  const auto run_start = Clock::now();
  RlPosition position;  // learners' (meaningful on the root)
  double rl_seconds = 0;
  bool stopped = false;
  std::unique_ptr<RoleExpertParallel> ep;  // EP groups of this rank's role, when degree > 1
  int migrations = 0;
  std::string reordering_json;    // summary.json fields of --reorder-samples (learners)
  uint64_t actor_sync_bytes = 0;  // what this actor received in weight syncs

  if (role != Role::Queue) {
    LearnerState learner;
    if (role == Role::Learner) {
      learner = allocate_learner_state(policy, rl);
      if (!saved.resuming()) {
        const WarmStart warm =
            warm_start_learner(policy, run, policy_options, sft, root, dir, trace);
        position.initial = warm.initial;
        position.before_rl = warm.before_rl;
      }
    }
    const std::vector<int>& actors = topology.ranks_of(Role::Actor);
    const std::vector<int>& learners = topology.ranks_of(Role::Learner);
    const HierarchicalComm& role_comm = topology.role_comm();
    Links& links = topology.links();
    Arena& device = policy.device->memory();
    // Only training has a backward to overlap with. TP x EP learners: EP over the learners with
    // the same TP rank (tp->data_parallel()).
    ep = attach_expert_parallel(model, role_tp ? role_tp->data_parallel() : role_comm, links,
                                ep_degree, options.ep_dispatch,
                                role == Role::Learner ? options.ep_overlap_chunks : 1,
                                role == Role::Learner ? redundant : 0);
    // The spare slots get their starting replicas before the reference copies the weights.
    if (role == Role::Learner && ep) ep->fill_redundant_slots(model.parameters(), model.layout());
    // TP (with or without EP): each TP rank computes its share of its group's tokens' routed
    // experts in every MoE layer (the KL reference's too), unless
    // --tensor-parallel-duplicate-experts.
    const bool expert_token_split = role_tp && !options.tensor_parallel_duplicate_experts;
    model.set_expert_token_split(expert_token_split);
    if (role == Role::Learner) start_learner_state(learner, policy, rl, ep.get());
    if (learner.reference) learner.reference->set_expert_token_split(expert_token_split);
    Transformer<float>* reference = learner.reference.get();
    AdamW<float>* optimizer = learner.optimizer.get();
    const TrainingState state{&model, optimizer, reference};
    // Expert-parallel learners record router statistics and, with --rebalance-every, move
    // experts between their EP ranks.
    std::unique_ptr<TrainRebalancer> rebalancer;
    if (role == Role::Learner && ep) {
      rebalancer = std::make_unique<TrainRebalancer>(
          options.rebalance, *ep, role_comm, model, *optimizer, reference, trace,
          tensor_parallel_expert_tokens(model, tp, expert_token_split));
      dir.log("%s", rebalancer->describe().c_str());
    }
    // Every learner reads the checkpoint (and its expert placement and rebalancer state); actors
    // get its weights from the first weight sync.
    saved.attach_rebalancer(rebalancer.get());
    if (role == Role::Learner && saved.resuming()) {
      position = saved.load(state, ep.get());
      dir.log("%s", position.placement_note.c_str());
    }
    // Actors learn where the run stands from the root (rank 0 of compute_ranks: learner 0 is
    // world rank 0 in every layout).
    MPI_Bcast(&position.step, 1, MPI_INT, 0, compute_ranks);
    // --reorder-samples: the learners move each step's samples between them before training.
    std::unique_ptr<SampleReordering> reordering;
    const ReorderCosts reorder_costs = parse_reorder_costs(options.reorder_samples);
    if (role == Role::Learner && reorder_costs != ReorderCosts::Off) {
      reordering = std::make_unique<SampleReordering>(reorder_costs, policy.config, role_comm.comm,
                                                      links, trace, rl.log_every);
      dir.log("%s", reordering->describe().c_str());
    }
    // With TP the data-parallel groups (one TP rank of every group) sum the gradients and the
    // step's statistics: the ranks of a TP group train the same samples.
    const DataParallelHooks learners_hooks =
        learner_hooks(tp ? tp->data_parallel() : role_comm, links, model, ep.get(), trace);
    const DataParallelHooks parallel =
        reordering ? reordering->timed(learners_hooks) : learners_hooks;
    const RlStepSettings settings = step_settings(rl);
    const GenerationSettings sampling = sampling_settings(rl, task, run.seed);
    const AdvantageEstimator estimator = parse_advantage_estimator(rl.advantage);
    // Each learner replica's (with TP each TP group's) part of a step's batch.
    const int64_t share = int64_t(rl.prompts) * rl.group_size / learner_replicas;
    const int learner_replica = tp ? tp->replica() : index_in(learners, topology.world_rank());
    // One DistQueue leader for the whole TP group, also where the group spans (virtual) nodes.
    HierarchicalComm tp_queue_group = tp ? tp->group() : HierarchicalComm{};
    tp_queue_group.intra = tp_queue_group.comm;
    // With TP every step's batch is whole in DistQueue before a TP group's leader asks for its
    // part (actors and learners meet once it is put), so the leader's get is one request per
    // shard: exactly 1/T of the requests and bytes of every TP rank fetching its own copy. With
    // StaleSync the end-of-step agreement already orders the puts before the gets, from the
    // second step of a run (or of a resumed one) on.
    auto batch_complete_barrier = [&](int step) {
      if (options.tensor_parallel > 1 && (schedule.lag == 0 || step == position.step + 1)) {
        serving_barrier(compute_ranks, queue);
      }
    };
    // Actors score: only they hold the learned reward model (in a host arena of their own).
    const std::unique_ptr<LearnedReward> learned =
        role == Role::Actor
            ? load_learned_reward(rl, policy.device->ops(), nullptr, run.device_memory_bytes())
            : nullptr;

    // The parameters this rank sends or receives in a weight sync (null on TP group 0's other
    // ranks, which only help assemble them).
    auto synced_parameters = [&] {
      if (role == Role::Learner && tp) return sync_model.assemble(model);
      return model.parameters();
    };
    // A learner's side of a sync with sharded experts: the parameters and layout it sends from.
    // Without TP its own. With TP, TP group 0 first assembles its slices onto learner 0
    // (collective over the group), which sends the replicated tensors and its experts from the
    // assembled model; TP rank 0 of every other TP group sends its experts from its own slice
    // (whole on every TP rank). Null params where the rank sends nothing.
    struct SyncSource {
      float* params = nullptr;
      const ParameterLayout* layout = nullptr;
    };
    auto expert_sync_source = [&]() -> SyncSource {
      if (!tp) return {model.parameters(), &model.layout()};
      if (sync_model.assembles()) {
        float* whole = sync_model.assemble(model);
        return whole ? SyncSource{whole, &sync_model.layout()} : SyncSource{};
      }
      return tp->rank() == 0 ? SyncSource{model.parameters(), &model.layout()} : SyncSource{};
    };
    // Learner 0 with actor TP groups and EP: each actor TP rank's slice of the replicated tensors.
    auto replicated_slices = [&](const SyncSource& source) {
      ExpertWeightSync::ReplicatedSlices slices;
      if (actor_tp_degree > 1 && weights.member()) {
        slices = replicated_actor_slices(source.params, *source.layout, policy.config,
                                         actor_tp_degree, options.tensor_parallel_attention_only);
      }
      return slices;
    };
    const std::vector<std::vector<int>>* learner_slots =
        role == Role::Learner && ep ? &ep->expert_slots() : nullptr;
    auto sync_weights = [&](int version) {
      // (TP learners outside group 0 hold no part of the sync without sharded experts; with them,
      // only TP rank 0 of the others sends.)
      if (role == Role::Learner && tp && !sync_model.assembles() &&
          !(expert_weights && tp->rank() == 0)) {
        return;
      }
      TraceScope traced(trace, Phase::WeightSync);
      const TrafficScope traffic(topology.links(), TrafficKind::WeightSync);
      traced.set_version(version);
      uint64_t bytes = 0;
      if (sliced_sync) {
        if (role == Role::Actor) {
          bytes =
              weights.broadcast_slice(actor_tp->rank(), model.parameters(), model.layout().total());
        } else if (float* whole = synced_parameters(); whole && weights.member()) {
          // (Learner 0: every actor TP rank's slice, one broadcast each.)
          bytes = weights.send_slices(actor_slices_for_sync.cut(whole));
        }
      } else if (!expert_weights) {
        bytes = weights.broadcast(synced_parameters(), synced_count);
      } else if (role == Role::Actor) {
        bytes = expert_weights->sync(model.parameters(), model.layout(), weights, nullptr);
      } else if (const SyncSource source = expert_sync_source(); source.params) {
        ExpertWeightSync::ReplicatedSlices slices = replicated_slices(source);
        bytes = expert_weights->sync(source.params, *source.layout, weights, learner_slots,
                                     slices.empty() ? nullptr : &slices);
      }
      traced.set_bytes(int64_t(bytes));
      if (role == Role::Actor) actor_sync_bytes += bytes;
    };
    const PostedWeightSync::Wait serving_wait = [&](std::vector<MPI_Request>& requests) {
      serve_until_complete(requests, queue);
    };
    // The version the actors generate a batch with: blocking with one step of lag (both sides
    // meet first in a barrier that serves DistQueue), posted by the learners that send it with
    // more (learner 0; with sharded experts the learners of replica 0 too).
    auto send_pipelined_weights = [&](int version) {
      if (!posted_weights) {
        serving_barrier(compute_ranks, queue);
        if (role == Role::Actor || learner_sends_weights) sync_weights(version);
        return;
      }
      if (role == Role::Learner && !learner_sends_weights) return;
      TraceScope traced(trace, Phase::WeightSync);
      const TrafficScope traffic(topology.links(), TrafficKind::WeightSync);
      traced.set_version(version);
      float* params = model.parameters();
      if (role == Role::Actor) {
        const uint64_t received =
            expert_weights
                ? expert_weights->receive(params, model.layout(), *posted_weights, serving_wait)
            : sliced_sync ? posted_weights->receive(params, model.layout().total(), serving_wait)
                          : posted_weights->receive(params, synced_count, serving_wait);
        traced.set_bytes(int64_t(received));
        actor_sync_bytes += received;
        return;
      }
      if (sliced_sync) {
        if (float* whole = synced_parameters(); whole && weights.member()) {
          traced.set_bytes(
              int64_t(posted_weights->post_slices(actor_slices_for_sync.cut(whole), serving_wait)));
        }
      } else if (!expert_weights) {
        traced.set_bytes(
            int64_t(posted_weights->post(synced_parameters(), synced_count, serving_wait)));
      } else if (const SyncSource source = expert_sync_source(); source.params) {
        const ExpertWeightSync::ReplicatedSlices slices = replicated_slices(source);
        traced.set_bytes(int64_t(expert_weights->post(source.params, *source.layout,
                                                      *posted_weights, learner_slots, serving_wait,
                                                      slices.empty() ? nullptr : &slices)));
      }
    };
    dir.log(
        "# RL: %d steps x %d prompts x %d samples on %zu actors and %zu learners, %s queue "
        "transfer\n",
        rl.steps, rl.prompts, rl.group_size, actors.size(), learners.size(),
        options.hierarchical_queue ? "hierarchical" : "flat");
    if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
      dir.log(
          "# expert parallelism: learners EP %d x %zu replicas%s, actors EP %d x %zu replicas, "
          "%s dispatch, training's experts in %d overlap chunk(s), %d redundant expert slot(s) "
          "per learner EP rank; this rank stores %lld of %lld parameters\n",
          options.expert_parallel,
          learners.size() / size_t(learner_tp) / size_t(options.expert_parallel),
          !tp ? ""
          : expert_token_split
              ? " (EP groups: the learners of one TP rank in consecutive TP groups, each TP rank "
                "dispatching its share of the group's tokens; TP rank 0 of each group of the "
                "first EP replica sends its experts to the actors)"
              : " (EP groups: the learners of one TP rank in consecutive TP groups, computing the "
                "TP group's tokens on each; TP rank 0 of each group of the first EP replica sends "
                "its experts to the actors)",
          options.actor_expert_parallel,
          actors.size() / size_t(actor_tp_degree) / size_t(options.actor_expert_parallel),
          dispatch_mode_name(options.ep_dispatch), options.ep_overlap_chunks, redundant,
          (long long)parameter_count, (long long)ParameterLayout(policy.config).total());
    }
    if (options.tensor_parallel > 1) {
      dir.log(
          "# tensor parallelism: learners TP %d x %d replicas (%s), routed experts %s, one "
          "DistQueue leader per TP group; the weight sync sends the whole model, assembled from "
          "TP group 0's slices on learner 0; actors generate %s; a learner stores %lld of %lld "
          "parameters\n",
          options.tensor_parallel, learner_replicas,
          options.tensor_parallel_attention_only ? "attention heads"
                                                 : "attention heads and the shared expert",
          options.tensor_parallel_duplicate_experts
              ? "on all of its group's tokens on every TP rank (duplicated)"
              : "on each TP rank's share of its group's tokens (token split)",
          options.actor_tensor_parallel > 1
              ? ("at TP " + std::to_string(options.actor_tensor_parallel) +
                 " (--actor-tensor-parallel), each actor receiving only its slice")
                    .c_str()
              : "data-parallel from the whole model",
          (long long)(tp ? parameter_count : 0), (long long)whole_layout.total());
    } else if (options.actor_tensor_parallel > 1) {
      dir.log(
          "# actor tensor parallelism: actors in TP groups of %d (%s, routed experts %s), each %s; "
          "each group generates its block of prompts collectively and its first rank puts the "
          "samples\n",
          options.actor_tensor_parallel,
          options.tensor_parallel_attention_only ? "attention heads"
                                                 : "attention heads and the shared expert",
          options.tensor_parallel_duplicate_experts ? "duplicated" : "token split",
          expert_weights ? "receiving only its slice of the replicated tensors, cut by learner 0, "
                           "and its group's experts"
                         : "receiving only its slice, cut by learner 0 from the whole model");
    }
    if (rl.staleness > 0) {
      dir.log(
          "# StaleSync: bound %d; actors generate batch k with version k - %d while learners train "
          "batch k - %d%s (decoupled objective, importance weights capped at %g)\n",
          rl.staleness, schedule.lag + 1, schedule.lag,
          posted_weights ? ", learner 0 posting each version without waiting" : "",
          double(rl.importance_cap));
    }
    // A StaleSync actor resuming puts the batches the checkpoint saved instead of generating them
    // (its weights, version k, are newer than the ones that generated them), each at its step.
    std::map<int, std::vector<Rollout>> restored_batches;
    if (role == Role::Actor && saved.resuming() && schedule.lag >= 1) {
      for (Rollout& r :
           unscored_rollouts(saved.saved_in_flight(topology.world_rank()), task, rl.group_size)) {
        const int64_t prompt = r.sample_id / rl.group_size;
        restored_batches[int(prompt / rl.prompts) + 1].push_back(std::move(r));
      }
      for (auto& [batch_step, batch] : restored_batches)
        score_rollouts(task, rl.group_size, estimator, batch, rollout_reward(learned));
    }
    QueuedBatches queued;  // an actor's batches in DistQueue (StaleSync)
    RlProgress progress(dir, rl.steps, rl.log_every, device);
    sync_weights(position.step);
    progress.start();
    saved.watch_signals();
    // Ranks that host queue shards keep serving them while they wait for the others.
    const auto serve_while_waiting = [&](MPI_Request& request) {
      serve_until_complete(std::span(&request, 1), queue);
    };
    for (int step = position.step + 1; step <= rl.steps && !stopped; ++step) {
      const int version = step - 1;
      if (role == Role::Actor) {
        const int generator = schedule.generation_version(step);
        // The learners sent this batch's version at step `step - lag` (in this process).
        const int sent_at = step - schedule.lag;
        if (sent_at > position.step && schedule.pipelined_sync_after(sent_at)) {
          send_pipelined_weights(generator);
        }
        // (An actor TP group generates its block collectively.)
        const auto [first, count] =
            actor_prompts(int64_t(version) * rl.prompts, rl.prompts,
                          actor_tp ? actor_tp->replica() : index_in(actors, topology.world_rank()),
                          actor_tp ? actor_tp->replicas() : int(actors.size()));
        std::vector<Rollout> rollouts;
        if (const auto restored = restored_batches.find(step); restored != restored_batches.end()) {
          rollouts = std::move(restored->second);
        } else {
          random_delay();
          TraceScope traced(trace, Phase::Generate);
          traced.set_version(generator);
          rollouts = generate_rollouts(model, task, first, count, rl.group_size, sampling,
                                       generator, estimator, rollout_reward(learned));
          int64_t generated = 0;
          for (const Rollout& r : rollouts) generated += int64_t(r.response.size());
          // An actor TP group's ranks draw the same samples: each counts its share, so that the
          // trace counts every token once.
          if (actor_tp) {
            generated = tensor_parallel_row_share(int(generated), actor_tp->slice().size,
                                                  actor_tp->slice().rank)
                            .count;
          }
          traced.add_tokens(generated);
        }
        if (schedule.lag >= 1) queued.add(step, to_in_flight(rollouts, rl.group_size));
        {
          TraceScope traced(trace, Phase::QueuePut);
          const TrafficScope traffic(topology.links(), TrafficKind::RolloutQueue);
          traced.set_version(generator);
          std::vector<QueueSample> samples = to_queue_samples(rollouts, rl.group_size);
          // (The ranks of an actor TP group hold the same samples: its first rank puts them.)
          if (actor_tp && actor_tp->rank() != 0) samples.clear();
          traced.set_bytes(int64_t(packed_bytes(samples)));
          if (!samples.empty()) queue.put(std::move(samples));
        }
        batch_complete_barrier(step);
        if (schedule.lag == 0) {
          sync_weights(version + 1);
          stopped = saved.stop_agreed(step, compute_ranks, serve_while_waiting);
          continue;
        }
        // `lag` steps ahead: this batch is put, so agree to the end of the learners' step
        // `sent_at` (a checkpoint of it saves the batches put after it); the learners send the
        // next version after that.
        if (sent_at > position.step) {
          stopped = saved.actor_end_of_step(sent_at, queued.after(sent_at), compute_ranks,
                                            serve_while_waiting);
        }
        // The learners' last steps end after the actors' last put.
        for (int end = std::max(sent_at, position.step) + 1;
             !stopped && step == rl.steps && end <= rl.steps; ++end) {
          stopped =
              saved.actor_end_of_step(end, queued.after(end), compute_ranks, serve_while_waiting);
        }
        continue;
      }
      // Learner.
      optimizer->hyper().learning_rate =
          cosine_learning_rate(rl.learning_rate, step, rl.warmup_steps, rl.steps, 1.0f);
      std::vector<Rollout> rollouts;
      batch_complete_barrier(step);
      {
        TraceScope traced(trace, Phase::QueueGet);
        const TrafficScope traffic(topology.links(), TrafficKind::RolloutQueue);
        traced.set_version(version);
        // Learner (with TP: TP group) i takes the i-th share of the step's sample ids, whatever
        // arrived first: the same samples every run, so a seed fixes the weights bit for bit.
        const int64_t first =
            int64_t(version) * rl.prompts * rl.group_size + learner_replica * share;
        // StaleSync's bound, enforced by the queue: nothing older than version - s comes back.
        const int32_t oldest = rl.staleness > 0 ? version - rl.staleness : DistQueue::kAnyVersion;
        const std::vector<QueueSample> samples =
            tp ? queue.get_range_replicated(first, share, tp_queue_group, oldest)
            : options.hierarchical_queue
                ? queue.get_range_hierarchical(first, share, role_comm, oldest)
                : queue.get_range(first, share, oldest);
        traced.set_bytes(int64_t(packed_bytes(samples)));
        rollouts = to_rollouts(samples);
      }
      serving_barrier(role_comm.comm, queue);
      if (schedule.pipelined_sync_after(step)) send_pipelined_weights(version);
      if (reordering) rollouts = reordering->reorder(std::move(rollouts), rl.group_size, version);
      random_delay();
      const auto train_start = Clock::now();
      // Every learner counts its share of the step's tokens (a TP group's ranks train the same
      // samples).
      const TokenShare learner_share{int(topology.ranks_of(Role::Learner).size()),
                                     topology.role_comm().rank()};
      const StepStats stats =
          train_on_rollouts_traced(model, *optimizer, reference, rollouts, settings, parallel,
                                   version, learner_share, trace);
      const double train_seconds =
          std::chrono::duration<double>(Clock::now() - train_start).count();
      if (reordering) dir.log("%s", reordering->end_of_step(step, train_seconds).c_str());
      if (rebalancer) {
        dir.log("%s", rebalancer->end_of_step(step, train_seconds).c_str());
        migrations = rebalancer->migrations();
      }
      // (With sharded experts every learner of replica 0 sends its own experts to the actors.)
      if (schedule.lag == 0 && learner_sends_weights) sync_weights(version + 1);
      position.rl_tokens += int64_t(stats.tokens);
      position.step_rewards.push_back(stats.mean_reward());
      progress.step_done(step, stats);
      stopped = saved.end_of_step(step, position, progress.seconds_since_start(), state, root,
                                  ep.get(), compute_ranks, dir, serve_while_waiting);
    }
    if (posted_weights && role == Role::Learner) {
      posted_weights->finish(serving_wait);
      if (expert_weights) expert_weights->finish(serving_wait);
    }
    rl_seconds = position.rl_seconds + progress.seconds_since_start();
    if (reordering) {
      dir.log("%s", reordering->summary().c_str());
      reordering_json = reordering->summary_json();
    }
  }
  queue.close();
  if (compute_ranks != MPI_COMM_NULL) MPI_Comm_free(&compute_ranks);
  // Every rank leaves together: queue ranks learn of the stop from the root.
  int stop = stopped ? 1 : 0;
  MPI_Bcast(&stop, 1, MPI_INT, topology.ranks_of(Role::Learner).front(), MPI_COMM_WORLD);
  if (stop) return kExitCheckpointedOnSignal;
  std::string tensor_parallel_json;
  if (options.tensor_parallel <= 1 && options.actor_tensor_parallel > 1) {
    tensor_parallel_json =
        "\"actor_tensor_parallel\":" + std::to_string(options.actor_tensor_parallel) + ",";
  }
  if (options.tensor_parallel > 1) {
    tensor_parallel_json = learner_tensor_parallel_json(
        queue, options.tensor_parallel, options.actor_tensor_parallel, sync_model.gathered_bytes());
    dir.log(
        "# tensor parallelism: learner 0 received %s assembling the whole model for the "
        "weight syncs\n",
        format_bytes(size_t(sync_model.gathered_bytes())).c_str());
  }
  // What the actors received in weight syncs, summed (with actor TP groups, their slices).
  unsigned long long actor_bytes = actor_sync_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &actor_bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  tensor_parallel_json += "\"weight_sync_actor_bytes\":" + std::to_string(actor_bytes) + ",";
  if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
    // Each rank's time in its role's EP exchanges (a rank without EP: none).
    tensor_parallel_json += ep_exchange_report(
        ep ? ep->communication_time() : SplitPhaseChain::Time{}, rl_seconds, dir);
  }
  MultiRankTrainEnd end;
  end.learner = role == Role::Learner;
  end.root = root;
  end.ep = ep.get();
  end.before_rl = position.before_rl;
  end.rl_seconds = rl_seconds;
  end.rl_tokens = position.rl_tokens;
  end.run_start = run_start;
  end.migrations = migrations;
  end.tensor_parallel = tp;
  end.memory_json = reordering_json + tensor_parallel_json;
  return finish_multi_rank_train(end, run, policy_options, sft, rl, options, policy, topology, dir,
                                 trace, result);
}

}  // namespace rlf
