#include "src/app/disaggregated_train.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "kernels/error.h"
#include "mpi_comm/hierarchical_collectives.h"
#include "src/app/build_info.h"
#include "src/app/rl_progress.h"
#include "src/io/parameter_file.h"
#include "src/io/run_directory.h"
#include "src/io/trace.h"
#include "src/io/trace_writer.h"
#include "src/model/lr_schedule.h"
#include "src/model/optimizer.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/rl/tokenizer.h"
#include "src/roles/dist_queue.h"
#include "src/roles/rollout_samples.h"
#include "src/roles/sample_packing.h"
#include "src/runtime/role_expert_parallel.h"
#include "src/runtime/weight_sync.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

void validate_layout_fit(const RlOptions& rl, const Topology& topology) {
  const int learners = int(topology.ranks_of(Role::Learner).size());
  const int64_t batch = int64_t(rl.prompts) * rl.group_size;
  if (batch % learners != 0) {
    throw ConfigError("--prompts x --group-size = " + std::to_string(batch) +
                      " samples per step must divide evenly among " + std::to_string(learners) +
                      " learner ranks");
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

// Waits for every learner while serving the queue shards this rank hosts: a learner blocked in a
// plain collective could not answer another learner still collecting its batch.
void serving_barrier(MPI_Comm comm, DistQueue& queue) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  queue.serve_until([&] {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

}  // namespace

int run_disaggregated_train(const RunOptions& run, const PolicyOptions& policy_options,
                            const SftSchedule& sft, const RlOptions& rl, const LayoutConfig& layout,
                            const DisaggregatedOptions& options,
                            const std::string& resolved_config) {
  Topology topology(MPI_COMM_WORLD, layout);
  validate_layout_fit(rl, topology);
  const Role role = topology.role();
  const bool root = topology.world_rank() == topology.ranks_of(Role::Learner).front();
  // Every rank checks the same inputs, so a bad value stops all of them before any work. Queue
  // ranks build the model too: loading --init is what rejects another model's checkpoint, and
  // a rank that skipped it would wait forever in the queue's collectives for the others.
  Policy policy = make_policy(run, policy_options, role == Role::Learner);
  validate_role_expert_parallel("--expert-parallel", options.expert_parallel,
                                topology.ranks_of(Role::Learner), policy.config.n_experts,
                                options.ep_dispatch, topology.links(), "learner");
  validate_role_expert_parallel("--actor-expert-parallel", options.actor_expert_parallel,
                                topology.ranks_of(Role::Actor), policy.config.n_experts,
                                options.ep_dispatch, topology.links(), "actor");
  RunDirectory dir(run.run_dir, resolved_config, /*writer=*/root);
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&policy.device->memory());
  DistQueueConfig queue_config;
  queue_config.shard_capacity = options.shard_capacity;
  DistQueue queue(MPI_COMM_WORLD, topology, queue_config);
  WeightSync weights(MPI_COMM_WORLD, topology);

  dir.log("# rlfusion train (disaggregated, synchronous): %s\n", build_info().c_str());
  dir.log("# model %s (%.2fM parameters), task %s, seed %llu, run dir %s\n",
          policy.config.name.c_str(), policy.config.parameter_count() / 1e6,
          policy.task->name().c_str(), (unsigned long long)run.seed, dir.path().c_str());
  dir.log("%s", topology.layout_table().c_str());

  Transformer<float>& model = *policy.model;
  const Task& task = *policy.task;
  const int64_t parameter_count = model.parameter_count();
  const auto run_start = Clock::now();
  Evaluation initial, before_rl, after;
  double rl_seconds = 0;
  int64_t rl_tokens = 0;
  std::unique_ptr<RoleExpertParallel> ep;  // EP groups of this rank's role, when degree > 1

  if (role != Role::Queue) {
    if (role == Role::Learner) {
      // Every learner runs the same seeded warm start, so all hold identical weights.
      if (root) initial = evaluate_traced(model, task, policy_options, trace);
      run_sft_phase(model, task, sft, dir, trace);
      if (root)
        before_rl = sft.steps > 0 ? evaluate_traced(model, task, policy_options, trace) : initial;
      dir.log("# held-out accuracy before RL: %.3f\n", before_rl.accuracy());
    }
    const std::vector<int>& actors = topology.ranks_of(Role::Actor);
    const std::vector<int>& learners = topology.ranks_of(Role::Learner);
    const HierarchicalComm& role_comm = topology.role_comm();
    Links& links = topology.links();
    Arena& device = policy.device->memory();
    // The SFT warm start above ran unsharded and identically on every learner; expert
    // parallelism starts with RL.
    const int ep_degree =
        role == Role::Learner ? options.expert_parallel : options.actor_expert_parallel;
    if (ep_degree > 1) {
      ep = std::make_unique<RoleExpertParallel>(role_comm, links, policy.config.n_experts,
                                                ep_degree, options.ep_dispatch);
      ep->attach(model);
    }

    std::unique_ptr<Transformer<float>> reference;
    std::unique_ptr<AdamW<float>> optimizer;
    if (role == Role::Learner) {
      if (rl.kl_coef > 0) {
        reference = std::make_unique<Transformer<float>>(policy.config, policy.device->ops(),
                                                         device, /*with_gradients=*/false);
        std::memcpy(reference->parameters(), model.parameters(),
                    size_t(parameter_count) * sizeof(float));
      }
      AdamWHyper hyper;
      hyper.learning_rate = rl.learning_rate;
      optimizer = std::make_unique<AdamW<float>>(model, hyper, rl.max_grad_norm);
      if (ep) {
        if (reference) ep->attach(*reference);
        optimizer->set_shard(ep->optimizer_shard(model.layout()));
      }
    }
    DataParallelHooks parallel;
    parallel.sum = [&](double x) {
      MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, role_comm.comm);
      return x;
    };
    parallel.reduce_gradients = [&] {
      TraceScope traced(trace, Phase::GradientReduce);
      if (ep) {
        traced.set_bytes(int64_t(ep->reduce_gradients(model.gradients(), model.layout())));
        return;
      }
      const LinkCounters before = links.counters();
      allreduce_sum(model.gradients(), parameter_count, role_comm, links);
      const LinkCounters& now = links.counters();
      traced.set_bytes(int64_t(now.bytes[0] + now.bytes[1] - before.bytes[0] - before.bytes[1]));
    };
    parallel.reduce_stats = [&](StepStats& s) {
      double v[7] = {s.samples, s.reward, s.correct,       s.response_tokens,
                     s.tokens,  s.kl,     s.clipped_tokens};
      MPI_Allreduce(MPI_IN_PLACE, v, 7, MPI_DOUBLE, MPI_SUM, role_comm.comm);
      s = StepStats{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
    };
    const RlStepSettings settings = step_settings(rl);
    const GenerationSettings sampling = sampling_settings(rl, task, run.seed);
    const AdvantageEstimator estimator = parse_advantage_estimator(rl.advantage);
    const int64_t share = int64_t(rl.prompts) * rl.group_size / int64_t(learners.size());

    auto sync_weights = [&](int version) {
      TraceScope traced(trace, Phase::WeightSync);
      traced.set_version(version);
      traced.set_bytes(int64_t(weights.broadcast(model.parameters(), parameter_count)));
    };
    dir.log(
        "# RL: %d steps x %d prompts x %d samples on %zu actors and %zu learners, %s queue "
        "transfer\n",
        rl.steps, rl.prompts, rl.group_size, actors.size(), learners.size(),
        options.hierarchical_queue ? "hierarchical" : "flat");
    if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
      dir.log(
          "# expert parallelism: learners EP %d x %zu replicas, actors EP %d x %zu replicas, %s "
          "dispatch\n",
          options.expert_parallel, learners.size() / size_t(options.expert_parallel),
          options.actor_expert_parallel, actors.size() / size_t(options.actor_expert_parallel),
          dispatch_mode_name(options.ep_dispatch));
    }
    RlProgress progress(dir, rl.steps, rl.log_every, device);
    sync_weights(0);
    progress.start();
    for (int step = 1; step <= rl.steps; ++step) {
      const int version = step - 1;
      if (role == Role::Actor) {
        const auto [first, count] =
            actor_prompts(int64_t(version) * rl.prompts, rl.prompts,
                          index_in(actors, topology.world_rank()), int(actors.size()));
        std::vector<Rollout> rollouts;
        {
          TraceScope traced(trace, Phase::Generate);
          traced.set_version(version);
          rollouts = generate_rollouts(model, task, first, count, rl.group_size, sampling, version,
                                       estimator);
          for (const Rollout& r : rollouts) traced.add_tokens(int64_t(r.response.size()));
        }
        {
          TraceScope traced(trace, Phase::QueuePut);
          traced.set_version(version);
          std::vector<QueueSample> samples = to_queue_samples(rollouts, rl.group_size);
          traced.set_bytes(int64_t(packed_bytes(samples)));
          queue.put(std::move(samples));
        }
        sync_weights(version + 1);
        continue;
      }
      // Learner.
      optimizer->hyper().learning_rate =
          cosine_learning_rate(rl.learning_rate, step, rl.warmup_steps, rl.steps, 1.0f);
      std::vector<Rollout> rollouts;
      {
        TraceScope traced(trace, Phase::QueueGet);
        traced.set_version(version);
        // Learner i takes the i-th share of the step's sample ids, whatever arrived first: the
        // same samples every run, so a seed fixes the weights bit for bit.
        const int64_t first = int64_t(version) * rl.prompts * rl.group_size +
                              index_in(learners, topology.world_rank()) * share;
        const std::vector<QueueSample> samples =
            options.hierarchical_queue ? queue.get_range_hierarchical(first, share, role_comm)
                                       : queue.get_range(first, share);
        traced.set_bytes(int64_t(packed_bytes(samples)));
        rollouts = to_rollouts(samples);
      }
      serving_barrier(role_comm.comm, queue);
      if (reference) {
        TraceScope traced(trace, Phase::Reference);
        traced.set_version(version);
        attach_reference_logprobs(*reference, rollouts, rl.micro_batch, rl.temperature);
      }
      StepStats stats;
      {
        TraceScope traced(trace, Phase::Train);
        traced.set_version(version);
        stats = optimize_on_rollouts(model, *optimizer, rollouts, settings, parallel);
        traced.set_tokens(int64_t(stats.tokens / double(learners.size())));
      }
      if (ep) {
        // Learner 0 evaluates, saves and sends the weights: it needs every expert's update.
        TraceScope traced(trace, Phase::WeightSync);
        traced.set_version(version + 1);
        traced.set_bytes(int64_t(ep->gather_experts(model.parameters(), model.layout())));
      }
      if (root) sync_weights(version + 1);
      rl_tokens += int64_t(stats.tokens);
      progress.step_done(step, stats);
    }
    rl_seconds = progress.seconds_since_start();
  }
  queue.close();
  if (root) {
    // Learner 0 holds every expert (gather_experts) and evaluates alone.
    model.set_expert_parallel({});
    after = evaluate_traced(model, task, policy_options, trace);
    save_parameters(dir.file("model.h5"), policy.config, model.layout(), model.parameters());
  }
  // Traffic of the whole run, summed over ranks.
  LinkCounters total = topology.links().counters();
  MPI_Allreduce(MPI_IN_PLACE, total.bytes.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, total.messages.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  DispatchTraffic dispatched = ep ? ep->traffic() : DispatchTraffic{};
  MPI_Allreduce(MPI_IN_PLACE, dispatched.payload.bytes.data(), 2, MPI_UINT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  write_trace(dir.file("trace.h5"), trace, MPI_COMM_WORLD, run_metadata("train", run, policy));
  const double total_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();

  dir.log("#\n# %-40s %14s\n", "summary", "value");
  dir.log("  %-40s %14.3f\n", "held-out accuracy before RL", before_rl.accuracy());
  dir.log("  %-40s %14.3f\n", "held-out accuracy after RL", after.accuracy());
  dir.log("  %-40s %14.0f\n", "RL throughput (tokens/s)",
          rl_seconds > 0 ? double(rl_tokens) / rl_seconds : 0.0);
  dir.log("  %-40s %14.1f\n", "RL time (s)", rl_seconds);
  dir.log("  %-40s %14.1f\n", "total time (s)", total_seconds);
  dir.log("  %-40s %14llu\n", "intra-node bytes (all ranks)",
          (unsigned long long)total.bytes[size_t(LinkClass::IntraNode)]);
  dir.log("  %-40s %14llu\n", "inter-node bytes (all ranks)",
          (unsigned long long)total.bytes[size_t(LinkClass::InterNode)]);
  if (options.expert_parallel > 1 || options.actor_expert_parallel > 1) {
    dir.log("  %-40s %14llu\n", "EP dispatch payload, intra-node bytes",
            (unsigned long long)dispatched.payload.bytes[size_t(LinkClass::IntraNode)]);
    dir.log("  %-40s %14llu\n", "EP dispatch payload, inter-node bytes",
            (unsigned long long)dispatched.payload.bytes[size_t(LinkClass::InterNode)]);
  }
  dir.log("# parameters in %s; trace in %s (rlfusion report %s)\n", dir.file("model.h5").c_str(),
          dir.file("trace.h5").c_str(), dir.path().c_str());
  char json[1024];
  std::snprintf(
      json, sizeof json,
      "{\"command\":\"train\",\"mode\":\"disaggregated\",\"task\":\"%s\",\"model\":\"%s\","
      "\"seed\":%llu,\"ranks\":%d,\"expert_parallel\":%d,\"actor_expert_parallel\":%d,"
      "\"sft_steps\":%d,\"rl_steps\":%d,"
      "\"heldout_accuracy_before_rl\":%.4f,\"heldout_accuracy_after_rl\":%.4f,"
      "\"rl_tokens_per_s\":%.1f,\"total_seconds\":%.3f}",
      policy.task->name().c_str(), policy.config.name.c_str(), (unsigned long long)run.seed,
      topology.world_size(), options.expert_parallel, options.actor_expert_parallel, sft.steps,
      rl.steps, before_rl.accuracy(), after.accuracy(),
      rl_seconds > 0 ? double(rl_tokens) / rl_seconds : 0.0, total_seconds);
  if (run.json) dir.log("%s\n", json);
  dir.finish(json);
  return 0;
}

}  // namespace rlf
