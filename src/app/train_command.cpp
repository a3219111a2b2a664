// `rlfusion train`: RL post-training on one rank. Optional SFT warm start, then per step: G
// samples per prompt from the current policy (behaviour log-probs and version recorded),
// rewards, group-relative advantages (GRPO or RLOO), PPO-clip with an optional k3 KL penalty to
// the frozen starting policy, AdamW. Held-out accuracy before and after, a progress line per
// step, everything written into the run directory.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "kernels/error.h"
#include "src/app/baseline_comparison.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/disaggregated_train.h"
#include "src/app/expert_rows_report.h"
#include "src/app/fused_train.h"
#include "src/app/layout_options.h"
#include "src/app/learned_reward.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/app/policy_setup.h"
#include "src/app/rl_options.h"
#include "src/app/rl_progress.h"
#include "src/app/sample_reordering.h"
#include "src/app/sft_phase.h"
#include "src/app/tensor_parallel_train.h"
#include "src/app/traced_training.h"
#include "src/app/train_checkpoints.h"
#include "src/io/parameter_file.h"
#include "src/io/trace_writer.h"
#include "src/model/lr_schedule.h"
#include "src/model/optimizer.h"
#include "src/rl/evaluation.h"
#include "src/rl/policy_loss.h"
#include "src/rl/rl_step.h"
#include "src/rl/rollout.h"
#include "src/rl/tokenizer.h"

namespace rlf {

namespace {

using Clock = std::chrono::steady_clock;

double mean(const std::vector<double>& v, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += v[i];
  return end > begin ? sum / double(end - begin) : 0.0;
}

}  // namespace

int run_train_command(const std::vector<std::string>& args) {
  RunOptions run;
  PolicyOptions policy_options;
  SftSchedule sft;
  RlOptions o;
  po::options_description description = run_options_description(run);
  description.add(policy_options_description(policy_options));
  description.add(sft_options_description(sft, "sft-", 0));
  description.add(rl_options_description(o));
  LayoutConfig layout;
  description.add(layout_options_description(layout));
  CheckpointOptions checkpoints;
  description.add(checkpoint_options_description(checkpoints));
  DisaggregatedOptions multi_rank;
  std::string queue_transfer = "hierarchical", ep_dispatch = "hierarchical";
  std::string mode = "disaggregated";
  std::string baseline = "none";
  {
    po::options_description d("Multi-rank options");
    auto add = d.add_options();
    add("mode", po::value(&mode)->default_value(mode),
        "how ranks share the work: disaggregated (actor, learner and queue ranks) | fused "
        "(every rank generates and trains; RL Fusion) | fused-all (fused, and the reference and "
        "reward models live in the device arena too)");
    add("queue-transfer", po::value(&queue_transfer)->default_value(queue_transfer),
        "how learners take batches from DistQueue: hierarchical (one request per node) | flat");
    add("queue-capacity",
        po::value(&multi_rank.shard_capacity)->default_value(multi_rank.shard_capacity),
        "samples each DistQueue shard holds before producers wait");
    add("expert-parallel",
        po::value(&multi_rank.expert_parallel)->default_value(multi_rank.expert_parallel),
        "expert-parallel degree of the learners: EP groups of this many consecutive learner "
        "ranks share the routed experts (with --pipeline-parallel: one stage's ranks in this "
        "many consecutive pipelines)");
    add("actor-expert-parallel",
        po::value(&multi_rank.actor_expert_parallel)
            ->default_value(multi_rank.actor_expert_parallel),
        "expert-parallel degree of the actors (0: the same as --expert-parallel)");
    add("ep-overlap-chunks",
        po::value(&multi_rank.ep_overlap_chunks)->default_value(multi_rank.ep_overlap_chunks),
        "with expert parallelism, training runs each layer's routed experts in this many chunks, "
        "the next chunk's dispatch and the last one's combine in flight meanwhile (1: off)");
    add("pipeline-pairing", po::bool_switch(&multi_rank.pipeline_pairing),
        "with --pipeline-parallel and --expert-parallel: a forward next to a backward of another "
        "micro-batch in the schedule runs with it as a pair, one computing while the other's MoE "
        "dispatch or combine is in flight (Adaptive Pipe / DualPipe); the same results");
    add("tensor-parallel",
        po::value(&multi_rank.tensor_parallel)->default_value(multi_rank.tensor_parallel),
        "tensor-parallel degree: groups of this many consecutive ranks hold one "
        "replica of the policy, each rank its share of the attention heads and of the shared "
        "expert (Megatron-style), and generate and train the same samples; with --expert-parallel "
        "E (fused) the routed experts are sharded over the ranks of one TP rank in E TP groups; "
        "--mode disaggregated: the learners form the TP groups, the actors generate "
        "data-parallel");
    add("trace-routing", po::bool_switch(&layout.trace_routing),
        "record every expert dispatch's router choices in trace.h5 (/rank_NNNNN/routing: 4 bytes "
        "per token and top-k slot, per dispatch), from which `rlfusion plan --validate` derives "
        "the expert_dispatch bytes exactly");
    add("tensor-parallel-attention-only",
        po::bool_switch(&multi_rank.tensor_parallel_attention_only),
        "with --tensor-parallel: cut only attention; the shared expert stays whole on every rank");
    add("tensor-parallel-duplicate-experts",
        po::bool_switch(&multi_rank.tensor_parallel_duplicate_experts),
        "with --tensor-parallel or --actor-tensor-parallel: every TP rank "
        "computes the routed experts of all of its group's tokens (with --expert-parallel: "
        "dispatches them all), so each expert computes them once per TP rank (without it each TP "
        "rank takes its share and the group allgathers the outputs); for comparison");
    add("actor-tensor-parallel",
        po::value(&multi_rank.actor_tensor_parallel)
            ->default_value(multi_rank.actor_tensor_parallel),
        "tensor-parallel degree of generation; --mode disaggregated (with --tensor-parallel): TP "
        "groups of this many consecutive actors (0, 1: data-parallel actors); --mode fused: "
        "dividing --tensor-parallel (0: "
        "--tensor-parallel, or 1 with --pipeline-parallel and --actor-pipeline-parallel 1): groups "
        "of this many consecutive "
        "ranks generate from TP slices regrouped for the phase (1: data-parallel from the whole "
        "model), with --pipeline-parallel each rank borrowing only its slice of the other "
        "stages; without --tensor-parallel (fused, no EP) any degree dividing the ranks and "
        "heads: each rank cuts its slice of its own model, or with --pipeline-parallel of every "
        "stage");
    add("pipeline-parallel",
        po::value(&multi_rank.pipeline_parallel)->default_value(multi_rank.pipeline_parallel),
        "--mode fused: pipeline-parallel degree: pipelines of this many consecutive ranks train "
        "one replica of the policy, each rank its stage's layers (1F1B, interleaved with "
        "--virtual-stages); generation borrows the other stages' layers and runs data-parallel");
    add("actor-pipeline-parallel",
        po::value(&multi_rank.actor_pipeline_parallel)
            ->default_value(multi_rank.actor_pipeline_parallel),
        "--mode fused with --pipeline-parallel P: the generation layout's pipeline degree, 1 "
        "(generation data-parallel, each rank borrowing the other stages' layers for the phase) "
        "or P (the training pipelines generate their ranks' prompts together, each stage from "
        "its own layers, nothing borrowed; with --tensor-parallel T each stage's TP group "
        "generating "
        "at TP T from its slices, with --expert-parallel E over the stage's training EP group; "
        "with --staleness each rank's rollout pool runs as a lane of its pipeline)");
    add("virtual-stages",
        po::value(&multi_rank.virtual_stages)->default_value(multi_rank.virtual_stages),
        "with --pipeline-parallel: model chunks per rank (> 1: interleaved 1F1B)");
    add("micro-batches",
        po::value(&multi_rank.micro_batches)->default_value(multi_rank.micro_batches),
        "with --pipeline-parallel: micro-batches per pipeline and step (0: each rank's samples in "
        "pieces of --micro-batch, as the data-parallel run trains them)");
    add("pipeline-balance",
        po::value(&multi_rank.pipeline_balance)->default_value(multi_rank.pipeline_balance),
        "with --pipeline-parallel: layers per model chunk: uniform | counted (balanced on counted "
        "FLOPs) | measured (balanced on layers timed before RL; not reproducible across runs) | "
        "the layers of each chunk in chunk order, e.g. 3,1");
    add("offload", po::bool_switch(&multi_rank.offload),
        "--mode fused: during generation, gradients and optimizer state leave device memory for "
        "host memory, and the generation phase gets their device memory");
    add("baseline", po::value(&baseline)->default_value(baseline),
        "none | disaggregated: first run the same config as synchronous disaggregated RL (into "
        "<run-dir>-baseline) and end with the speed-up over it");
    add("ep-dispatch", po::value(&ep_dispatch)->default_value(ep_dispatch),
        "expert-parallel token dispatch: hierarchical (once per node, then inside the node) | "
        "flat-dedup | flat");
    description.add(d);
  }
  description.add(rebalance_options_description(multi_rank.rebalance));
  description.add(reorder_options_description(multi_rank.reorder_samples));
  po::variables_map parsed;
  if (!parse_options("train", args, description, run, &parsed)) return 0;
  validate(sft, "sft-");
  validate(o);
  if (queue_transfer != "hierarchical" && queue_transfer != "flat") {
    throw ConfigError("--queue-transfer must be 'hierarchical' or 'flat', got '" + queue_transfer +
                      "'");
  }
  if (mode != "disaggregated" && mode != "fused" && mode != "fused-all") {
    throw ConfigError("--mode must be 'disaggregated', 'fused' or 'fused-all', got '" + mode + "'");
  }
  const bool fused = mode == "fused" || mode == "fused-all";
  if (multi_rank.offload && !fused) {
    throw ConfigError("--offload needs --mode fused (only fused ranks generate and train)");
  }
  if (multi_rank.ep_overlap_chunks < 1) {
    throw ConfigError("--ep-overlap-chunks must be >= 1, got " +
                      std::to_string(multi_rank.ep_overlap_chunks));
  }
  if (multi_rank.shard_capacity < 1) throw ConfigError("--queue-capacity must be >= 1");
  validate(multi_rank.rebalance, multi_rank.expert_parallel);
  policy_options.router_skew = multi_rank.rebalance.router_skew;
  layout.links.validate();
  multi_rank.hierarchical_queue = queue_transfer == "hierarchical";
  multi_rank.ep_dispatch = parse_dispatch_mode(ep_dispatch, "--ep-dispatch");
  if (multi_rank.actor_expert_parallel == 0)
    multi_rank.actor_expert_parallel = multi_rank.expert_parallel;
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size == 1 &&
      (multi_rank.expert_parallel != 1 || multi_rank.actor_expert_parallel != 1)) {
    throw ConfigError(
        "--expert-parallel and --actor-expert-parallel need a multi-rank run (a single rank "
        "holds every expert); got " +
        std::to_string(multi_rank.expert_parallel) + " and " +
        std::to_string(multi_rank.actor_expert_parallel) + " on 1 rank");
  }
  validate_tensor_parallel_train(multi_rank, mode, world_size, o);
  validate_pipeline_parallel_train(multi_rank, mode == "fused", world_size, o);
  validate_sample_reordering(multi_rank, o, world_size);
  if (o.staleness > 0 && world_size == 1) {
    throw ConfigError(
        "--staleness " + std::to_string(o.staleness) +
        " needs a multi-rank run: disaggregated actors and learners overlap their steps, fused "
        "ranks cut the long tail (mpiexec -n 2 or more)");
  }
  validate_checkpoint_options(checkpoints);
  // The reward model file is read on every rank, so a bad one stops all of them here.
  validate_reward_model(o, *make_task(load_task_config(policy_options.task, run.seed)));
  if (baseline != "none" && baseline != "disaggregated") {
    throw ConfigError("--baseline must be 'none' or 'disaggregated', got '" + baseline + "'");
  }
  if (baseline != "none" && multi_rank.tensor_parallel > 1) {
    throw ConfigError("--baseline is not supported with --tensor-parallel");
  }
  if (baseline != "none" && fused && multi_rank.actor_tensor_parallel > 1) {
    throw ConfigError("--baseline is not supported with --actor-tensor-parallel in fused mode");
  }
  if (baseline != "none" && multi_rank.pipeline_parallel > 1) {
    throw ConfigError("--baseline is not supported with --pipeline-parallel");
  }
  if (baseline != "none" && world_size == 1) {
    throw ConfigError("--baseline disaggregated needs a multi-rank run (an actor and a learner)");
  }
  if (baseline != "none" && (checkpoints.every > 0 || !checkpoints.resume.empty())) {
    throw ConfigError("--baseline is not supported with --checkpoint-every or --resume");
  }
  if (world_size > 1) {
    auto run_itself = [&](TrainResult* result) {
      if (fused) {
        return run_fused_train(run, policy_options, sft, o, layout, multi_rank, mode == "fused-all",
                               format_options(parsed), result, checkpoints);
      }
      return run_disaggregated_train(run, policy_options, sft, o, layout, multi_rank,
                                     format_options(parsed), result, checkpoints);
    };
    if (baseline == "none") return run_itself(nullptr);
    // The run's own directory is checked first, so a finished run stops before the baseline.
    RunDirectory::check_writable(run.run_dir, policy_options.overwrite);
    const std::string name =
        mode + (o.staleness > 0 ? ", StaleSync s=" + std::to_string(o.staleness) : "");
    return run_with_baseline(run, policy_options, sft, o, layout, multi_rank, name, run_itself);
  }
  const AdvantageEstimator estimator = parse_advantage_estimator(o.advantage);
  Policy policy = make_policy(run, policy_options, /*with_gradients=*/true);
  Transformer<float>& model = *policy.model;
  const Task& task = *policy.task;
  // On one rank the reward model shares the device arena only when asked (fused-all).
  const std::unique_ptr<LearnedReward> learned = load_learned_reward(
      o, policy.device->ops(), mode == "fused-all" ? &policy.device->memory() : nullptr,
      run.device_memory_bytes());

  TrainCheckpoints saved(checkpoints, run, o, policy.config, /*supported=*/true);
  RunDirectory dir(run.run_dir, format_options(parsed), /*writer=*/true, saved.resuming());
  TraceRecorder trace(MPI_COMM_WORLD);
  trace.set_memory_source(&policy.device->memory());
  dir.log("# rlfusion train: %s\n", build_info().c_str());
  dir.log("# model %s (%.2fM parameters), task %s, %s, seed %llu, run dir %s\n",
          policy.config.name.c_str(), policy.config.parameter_count() / 1e6, task.name().c_str(),
          policy.device->describe().c_str(), (unsigned long long)run.seed, dir.path().c_str());
  dir.log("%s", describe_learned_reward(o, learned.get()).c_str());
  dir.log("%s", describe_router_skew(multi_rank.rebalance).c_str());
  saved.describe(dir);
  const auto run_start = Clock::now();
  RlPosition position;
  if (!saved.resuming()) {
    position.initial = evaluate_traced(model, task, policy_options, trace);
    dir.log("# held-out accuracy at start: %.3f\n", position.initial.accuracy());
    run_sft_phase(model, task, sft, dir, trace);
    position.before_rl =
        sft.steps > 0 ? evaluate_traced(model, task, policy_options, trace) : position.initial;
    if (sft.steps > 0) {
      dir.log("# held-out accuracy after SFT: %.3f\n", position.before_rl.accuracy());
    }
  }

  Arena& device = policy.device->memory();
  // The frozen reference policy (the starting point of RL) for the KL penalty.
  std::unique_ptr<Transformer<float>> reference;
  if (o.kl_coef > 0) {
    reference = std::make_unique<Transformer<float>>(policy.config, policy.device->ops(), device,
                                                     /*with_gradients=*/false);
    std::memcpy(reference->parameters(), model.parameters(),
                size_t(model.parameter_count()) * sizeof(float));
  }
  AdamWHyper hyper;
  hyper.learning_rate = o.learning_rate;
  AdamW<float> optimizer(model, hyper, o.max_grad_norm);
  const TrainingState state{&model, &optimizer, reference.get()};
  if (saved.resuming()) position = saved.load(state);
  const RlStepSettings settings = step_settings(o);
  const GenerationSettings sampling = sampling_settings(o, task, run.seed);

  dir.log("# RL: %d steps x %d prompts x %d samples, %s advantages, clip %.2f, kl %.3g\n", o.steps,
          o.prompts, o.group_size, o.advantage.c_str(), o.clip_epsilon, o.kl_coef);
  RlProgress progress(dir, o.steps, o.log_every, device);
  progress.start();
  saved.watch_signals();
  for (int step = position.step + 1; step <= o.steps; ++step) {
    optimizer.hyper().learning_rate =
        cosine_learning_rate(o.learning_rate, step, o.warmup_steps, o.steps, 1.0f);
    const int version = step - 1;
    std::vector<Rollout> rollouts;
    {
      TraceScope traced(trace, Phase::Generate);
      traced.set_version(version);
      rollouts =
          generate_rollouts(model, task, int64_t(version) * o.prompts, o.prompts, o.group_size,
                            sampling, version, estimator, rollout_reward(learned));
      for (const Rollout& r : rollouts) traced.add_tokens(int64_t(r.response.size()));
    }
    const StepStats s = train_on_rollouts_traced(model, optimizer, reference.get(), rollouts,
                                                 settings, DataParallelHooks{}, version, {}, trace);
    position.rl_tokens += int64_t(s.tokens);
    position.step_rewards.push_back(s.mean_reward());
    progress.step_done(step, s);
    if (o.eval_every > 0 && step % o.eval_every == 0 && step != o.steps) {
      const Evaluation e = evaluate_traced(model, task, policy_options, trace);
      dir.log("# held-out accuracy after RL step %d: %.3f\n", step, e.accuracy());
    }
    if (saved.end_of_step(step, position, progress.seconds_since_start(), state, /*writer=*/true,
                          nullptr, MPI_COMM_WORLD, dir)) {
      return kExitCheckpointedOnSignal;
    }
  }
  const double rl_seconds = position.rl_seconds + progress.seconds_since_start();
  const int64_t rl_tokens = position.rl_tokens;
  const std::vector<double>& step_rewards = position.step_rewards;
  const Evaluation& initial = position.initial;
  const Evaluation& before_rl = position.before_rl;
  const Evaluation after = evaluate_traced(model, task, policy_options, trace);
  save_parameters(dir.file("model.h5"), policy.config, model.layout(), model.parameters());
  const double total_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();

  dir.log("#\n# %-40s %14s\n", "summary", "value");
  if (sft.steps > 0) dir.log("  %-40s %14.3f\n", "held-out accuracy at start", initial.accuracy());
  dir.log("  %-40s %14.3f\n", "held-out accuracy before RL", before_rl.accuracy());
  dir.log("  %-40s %14.3f\n", "held-out accuracy after RL", after.accuracy());
  // Rewards of single steps are noisy: compare the first and last tenth of the run.
  const size_t tenth = std::max<size_t>(1, step_rewards.size() / 10);
  dir.log("  %-40s %14.3f\n", "mean reward, first 10% of RL steps",
          mean(step_rewards, 0, std::min(tenth, step_rewards.size())));
  dir.log("  %-40s %14.3f\n", "mean reward, last 10% of RL steps",
          mean(step_rewards, step_rewards.size() - std::min(tenth, step_rewards.size()),
               step_rewards.size()));
  dir.log("  %-40s %14.0f\n", "RL throughput (tokens/s)",
          rl_seconds > 0 ? rl_tokens / rl_seconds : 0);
  dir.log("  %-40s %14.1f\n", "RL time (s)", rl_seconds);
  dir.log("  %-40s %14.1f\n", "total time (s)", total_seconds);
  dir.log("  %-40s %14s\n", "device memory peak", format_bytes(device.peak()).c_str());
  const double touched = touched_experts_per_call(model);
  std::map<std::string, std::string> metadata = run_metadata("train", run, policy);
  add_touched_experts(metadata, touched);
  write_trace(dir.file("trace.h5"), trace, MPI_COMM_WORLD, metadata);
  dir.log("# held-out prompts: %d; parameters in %s; trace in %s (rlfusion report %s)\n",
          after.prompts, dir.file("model.h5").c_str(), dir.file("trace.h5").c_str(),
          dir.path().c_str());
  char json[2048];
  std::snprintf(json, sizeof json,
                "{\"command\":\"train\",\"mode\":\"one-rank\",\"task\":\"%s\",\"model\":\"%s\","
                "\"seed\":%llu,%s%s%s"
                "\"sft_steps\":%d,\"rl_steps\":%d,\"heldout_accuracy_start\":%.4f,"
                "\"heldout_accuracy_before_rl\":%.4f,\"heldout_accuracy_after_rl\":%.4f,"
                "\"rl_tokens_per_s\":%.1f,\"total_seconds\":%.3f}",
                task.name().c_str(), policy.config.name.c_str(), (unsigned long long)run.seed,
                reward_json(o).c_str(), router_skew_json(multi_rank.rebalance).c_str(),
                touched_experts_json(touched).c_str(), sft.steps, o.steps, initial.accuracy(),
                before_rl.accuracy(), after.accuracy(),
                rl_seconds > 0 ? rl_tokens / rl_seconds : 0.0, total_seconds);
  if (run.json) dir.log("%s\n", json);
  dir.finish(json);
  return 0;
}

}  // namespace rlf
