#include "src/app/train_finish.h"

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/app/expert_rows_report.h"
#include "src/app/learned_reward.h"
#include "src/io/parameter_file.h"
#include "src/io/trace_writer.h"
#include "src/runtime/pipeline_layout_switch.h"
#include "src/runtime/tensor_expert_parallel.h"

namespace rlf {

int finish_multi_rank_train(const MultiRankTrainEnd& end, const RunOptions& run,
                            const PolicyOptions& policy_options, const SftSchedule& sft,
                            const RlOptions& rl, const DisaggregatedOptions& options,
                            Policy& policy, Topology& topology, RunDirectory& dir,
                            TraceRecorder& trace, TrainResult* result) {
  // Learner 0's weight-sync time, swap included (offload, reshard, onload in fused mode),
  // before the evaluation below adds events: the sender's time is the transfer; an actor's
  // includes waiting for the learner to finish its step.
  double weight_sync_seconds = 0;
  double halves[2] = {0, 0};  // this rank's generation and training seconds
  double idle_seconds = 0;    // this rank's RL Idle events
  for (const TraceEvent& e : trace.events()) {
    if (e.phase == Phase::Idle && e.version != kNoVersion) idle_seconds += e.end - e.begin;
    if (e.phase == Phase::Generate) halves[0] += e.end - e.begin;
    // (SFT's Train events carry no policy version)
    const bool rl_training =
        e.phase == Phase::Reference || e.phase == Phase::Proximal || e.phase == Phase::Train;
    if (rl_training && e.version != kNoVersion) {
      halves[1] += e.end - e.begin;
    }
    // (version 0 of weight_sync is the initial sync before the first step)
    const bool sync = e.phase == Phase::WeightSync && e.version > 0;
    const bool swap =
        e.phase == Phase::Reshard || e.phase == Phase::Offload || e.phase == Phase::Onload;
    if (sync || swap) weight_sync_seconds += e.end - e.begin;
  }
  Transformer<float>& model = *policy.model;
  Evaluation after;
  // Learner 0 evaluates and saves the whole model; with sharded experts it first collects each
  // expert from its owner into a whole model in a temporary arena.
  std::unique_ptr<Arena> whole_memory;
  std::unique_ptr<Transformer<float>> whole;
  if (end.root && (model.layout().expert_sharded() || end.tensor_parallel || end.pipeline)) {
    whole_memory = std::make_unique<Arena>("whole model (evaluation)", run.device_memory_bytes(),
                                           policy.device->memory_kind());
    whole = std::make_unique<Transformer<float>>(policy.config, policy.device->ops(), *whole_memory,
                                                 /*with_gradients=*/false);
  }
  // Whatever is sent from here on gathers the model for model.h5 (no collective after it counts).
  const TrafficScope final_gather(topology.links(), TrafficKind::FinalGather);
  if (end.ep && end.tensor_parallel && !end.pipeline) {
    // TP x EP: the experts come together on the first TP group, which assembles the slices.
    gather_tensor_expert_parallel(
        model.parameters(), model.layout(), whole ? whole->parameters() : nullptr,
        ParameterLayout(policy.config), policy.config, *end.tensor_parallel, *end.ep);
  } else if (end.ep && end.learner && !end.pipeline) {
    const ParameterLayout whole_layout(policy.config);
    end.ep->gather_full_model(model.parameters(), model.layout(),
                              whole ? whole->parameters() : nullptr, whole_layout);
  } else if (end.tensor_parallel && !end.pipeline) {
    // Collective over the TP group: every rank of it assembles the whole model. (With a pipeline
    // too, gather_pipeline_model assembles each stage's TP slices first.)
    const ParameterLayout whole_layout(policy.config);
    std::vector<float> gathered(whole ? 0 : size_t(whole_layout.total()));
    gather_tensor_parallel(model.parameters(), model.layout(),
                           whole ? whole->parameters() : gathered.data(), whole_layout,
                           policy.config, *end.tensor_parallel);
  }
  if (end.pipeline) {
    // With EP inside the stages, each stage's experts first come together on its rank of the first
    // pipeline (collective over the stage's first EP group); that pipeline then gathers.
    const float* stage = model.parameters();
    std::vector<float> stage_experts;
    if (end.ep) {
      // (With TP inside the stages, this rank's TP slice of the stage with every expert.)
      const ParameterLayout every_expert =
          end.pipeline->stage_layout(end.pipeline->stage(), ExpertShard{});
      const TensorParallel* tp = end.pipeline->tensor_parallel();
      const ParameterLayout stage_layout =
          tp ? with_tensor_slice(policy.config, every_expert, tp->slice()) : every_expert;
      stage_experts.resize(size_t(stage_layout.total()));
      end.ep->gather_full_model(model.parameters(), model.layout(), stage_experts.data(),
                                stage_layout);
      stage = stage_experts.data();
    }
    // Collective over the first pipeline (the other replicas hold the same values): its first
    // stage, world rank 0's, receives the other stages' layers (with TP, each stage's TP slices
    // come together on its TP rank 0 first, and TP rank 0's pipeline gathers).
    if (end.pipeline->replica() == 0) {
      const ParameterLayout whole_layout(policy.config);
      const bool assembles = assembles_pipeline_model(*end.pipeline);
      std::vector<float> gathered(whole || !assembles ? 0 : size_t(whole_layout.total()));
      gather_pipeline_model(stage, *end.pipeline, whole ? whole->parameters() : gathered.data(),
                            whole_layout, /*root=*/0);
    }
  }
  if (end.root) {
    Transformer<float>& final_model = whole ? *whole : model;
    after = evaluate_traced(final_model, *policy.task, policy_options, trace);
    save_parameters(dir.file("model.h5"), policy.config, final_model.layout(),
                    final_model.parameters());
  }
  // This rank's traffic per link class goes into the trace (`rlfusion report` shows it per rank).
  const LinkCounters& own = topology.links().counters();
  std::vector<LinkTraffic> own_traffic;
  for (const LinkClass link : {LinkClass::IntraNode, LinkClass::InterNode}) {
    own_traffic.push_back(
        {int32_t(link), int64_t(own.bytes[size_t(link)]), int64_t(own.messages[size_t(link)])});
  }
  trace.set_link_traffic(std::move(own_traffic));
  // With --trace-routing, what the expert dispatchers were given (plan --validate derives their
  // bytes from it).
  if (RoutingLog* routing = topology.links().routing_log()) trace.set_routing(routing->take());
  // Traffic of the whole run, summed over ranks.
  LinkCounters total = own;
  MPI_Allreduce(MPI_IN_PLACE, total.bytes.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, total.messages.data(), 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  // And per traffic kind: kind k's intra- and inter-node bytes at [2 k], [2 k + 1].
  std::vector<uint64_t> by_kind;
  for (const TrafficKind kind : all_traffic_kinds()) {
    const LinkCounters& c = topology.links().counters(kind);
    by_kind.insert(by_kind.end(), c.bytes.begin(), c.bytes.end());
  }
  MPI_Allreduce(MPI_IN_PLACE, by_kind.data(), int(by_kind.size()), MPI_UINT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  DispatchTraffic dispatched = end.ep ? end.ep->traffic() : DispatchTraffic{};
  MPI_Allreduce(MPI_IN_PLACE, dispatched.payload.bytes.data(), 2, MPI_UINT64_T, MPI_SUM,
                MPI_COMM_WORLD);
  const double touched = touched_experts_per_call(model);
  std::map<std::string, std::string> metadata = run_metadata("train", run, policy);
  add_touched_experts(metadata, touched);
  metadata["mode"] = end.mode;
  metadata["staleness"] = std::to_string(rl.staleness);
  metadata["expert_parallel"] = std::to_string(options.expert_parallel);
  metadata["tensor_parallel"] = std::to_string(options.tensor_parallel);
  metadata["pipeline_parallel"] = std::to_string(options.pipeline_parallel);
  write_trace(dir.file("trace.h5"), trace, MPI_COMM_WORLD, metadata);
  const double tokens_per_s = end.rl_seconds > 0 ? double(end.rl_tokens) / end.rl_seconds : 0.0;
  // Every figure as learner 0 (world rank 0 in every layout) has it.
  double figures[5] = {tokens_per_s, end.rl_seconds, weight_sync_seconds, end.before_rl.accuracy(),
                       after.accuracy()};
  MPI_Bcast(figures, 5, MPI_DOUBLE, topology.ranks_of(Role::Learner).front(), MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, halves, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &idle_seconds, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (result) {
    *result = TrainResult{figures[0], figures[1], figures[2], figures[3],
                          figures[4], halves[0],  halves[1],  idle_seconds};
    const double rank_seconds = figures[1] * topology.world_size();
    result->idle_share = rank_seconds > 0 ? idle_seconds / rank_seconds : 0;
  }
  const double total_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - end.run_start).count();

  dir.log("#\n# %-40s %14s\n", "summary", "value");
  dir.log("  %-40s %14.3f\n", "held-out accuracy before RL", end.before_rl.accuracy());
  dir.log("  %-40s %14.3f\n", "held-out accuracy after RL", after.accuracy());
  dir.log("  %-40s %14.0f\n", "RL throughput (tokens/s)",
          end.rl_seconds > 0 ? double(end.rl_tokens) / end.rl_seconds : 0.0);
  dir.log("  %-40s %14.1f\n", "RL time (s)", end.rl_seconds);
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
  // (Last in summary.json: its keys, such as "tensor_parallel", must not come before the run's
  // own fields of the same name for readers that take a key's first match.)
  std::string traffic_json = ",\"traffic_bytes\":{";
  bool any_kind = false;
  for (const TrafficKind kind : all_traffic_kinds()) {
    const uint64_t intra = by_kind[2 * size_t(kind)], inter = by_kind[2 * size_t(kind) + 1];
    if (intra + inter == 0) continue;
    if (!any_kind)
      dir.log("# bytes by traffic kind (all ranks)%10s %14s %14s\n", "", "intra-node",
              "inter-node");
    dir.log("  %-40s %14llu %14llu\n", traffic_kind_name(kind), (unsigned long long)intra,
            (unsigned long long)inter);
    traffic_json += std::string(any_kind ? "," : "") + "\"" + traffic_kind_name(kind) + "\":[" +
                    std::to_string(intra) + "," + std::to_string(inter) + "]";
    any_kind = true;
  }
  traffic_json += "}";
  dir.log("# parameters in %s; trace in %s (rlfusion report %s)\n", dir.file("model.h5").c_str(),
          dir.file("trace.h5").c_str(), dir.path().c_str());
  char json[4096];
  std::snprintf(json, sizeof json,
                "{\"command\":\"train\",\"mode\":\"%s\",\"task\":\"%s\",\"model\":\"%s\","
                "\"seed\":%llu,%s%s%s%s\"migrations\":%d,\"replicated_experts\":%d,\"ranks\":%d,"
                "\"expert_parallel\":%d,\"actor_"
                "expert_parallel\":%d,\"tensor_parallel\":%d,"
                "\"staleness\":%d,\"sft_steps\":%d,\"rl_steps\":%d,"
                "\"heldout_accuracy_before_rl\":%.4f,\"heldout_accuracy_after_rl\":%.4f,"
                "\"rl_tokens_per_s\":%.1f,\"rl_seconds\":%.3f,\"weight_sync_seconds\":%.6f,"
                "\"total_seconds\":%.3f%s}",
                end.mode, policy.task->name().c_str(), policy.config.name.c_str(),
                (unsigned long long)run.seed, reward_json(rl).c_str(), end.memory_json.c_str(),
                router_skew_json(options.rebalance).c_str(), touched_experts_json(touched).c_str(),
                end.migrations, end.ep && end.learner ? end.ep->replicated_experts() : 0,
                topology.world_size(), options.expert_parallel, options.actor_expert_parallel,
                options.tensor_parallel, rl.staleness, sft.steps, rl.steps,
                end.before_rl.accuracy(), after.accuracy(), tokens_per_s, end.rl_seconds,
                figures[2], total_seconds, traffic_json.c_str());
  if (run.json) dir.log("%s\n", json);
  dir.finish(json);
  return 0;
}

}  // namespace rlf
