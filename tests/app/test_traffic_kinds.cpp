// Every multi-rank `train` run counts its link bytes by traffic kind (mpi_comm/traffic_kind.h,
// summary.json's "traffic_bytes"): the kinds add up to the link counters, each algorithm's bytes
// land in its own kind, and `plan --validate` (src/sim/counted_bytes.cpp) predicts every kind its
// rules fix to the byte on fresh runs, as jobs/local/validate_planner.sh checks them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mpi_comm/traffic_kind.h"
#include "tests/app/fused_train_runs.h"
#include "tests/app/json_output.h"
#include "tests/app/run_rlfusion.h"

namespace rlf {
namespace {

// The kinds' names, as summary.json and the CSV columns spell them.
std::vector<std::string> kind_names() {
  std::vector<std::string> names;
  for (const TrafficKind kind : all_traffic_kinds()) names.push_back(traffic_kind_name(kind));
  return names;
}

struct RunBytes {
  std::map<std::string, long long> by_kind;  // intra + inter
  long long intra = 0, inter = 0;            // the link counters (all ranks)
  long long tokens = 0;                      // trained (the report's total)
  long long response_tokens = 0;             // generated (the report's generate phases)
  long long migrations = 0;                  // EDPB's (summary.json)
  long long decode_steps = -1;  // generation inside the pipelines' (summary.json; -1: none)
  long long generation_peak = 0, training_peak = 0;  // rank 0's device arena (summary.json)
  std::string trace;  // trace.h5: the trained samples' ids and lengths
  std::string lanes;  // StaleSync's lanes inside the pipelines (summary.json), space-separated
  int staleness = 0;
};

long long log_counter(const std::string& log, const std::string& label) {
  const size_t at = log.find(label);
  EXPECT_NE(at, std::string::npos) << label << "\n" << log;
  return at == std::string::npos ? -1 : std::stoll(log.substr(at + label.size()));
}

RunBytes run_and_count(const std::string& name, const std::string& options, int ranks = 2) {
  const std::string dir = test::fresh_temp_dir(name);
  const auto run = test::run_rlfusion(
      "train --model tiny --task sort --sft-steps 0 --steps 3 --prompts 8 --group-size 4 "
      "--micro-batch 4 --eval-prompts 4 --eval-every 0 --log-every 3 --ranks-per-node 1 --json " +
          options + " --run-dir " + dir,
      ranks);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  RunBytes out;
  out.trace = dir + "/trace.h5";
  const size_t traffic = run.output.find("\"traffic_bytes\":{");
  EXPECT_NE(traffic, std::string::npos) << run.output;
  if (traffic == std::string::npos) return out;
  const std::string object = run.output.substr(traffic, run.output.find('}', traffic) - traffic);
  for (const std::string& kind : kind_names()) {
    const size_t at = object.find("\"" + kind + "\":[");
    if (at == std::string::npos) continue;
    std::istringstream pair(object.substr(object.find('[', at) + 1));
    long long intra = 0, inter = 0;
    char comma = 0;
    pair >> intra >> comma >> inter;
    out.by_kind[kind] = intra + inter;
  }
  out.migrations = (long long)test::json_number(run.output, "migrations");
  if (const size_t lanes = run.output.find("\"pipeline_lanes\":["); lanes != std::string::npos) {
    const size_t begin = run.output.find('[', lanes) + 1;
    out.lanes = run.output.substr(begin, run.output.find(']', begin) - begin);
    std::replace(out.lanes.begin(), out.lanes.end(), ',', ' ');
  }
  const double decode_steps = test::json_number(run.output, "pipeline_decode_steps");
  if (!std::isnan(decode_steps)) out.decode_steps = (long long)decode_steps;
  const size_t peaks = run.output.find("\"device_memory_peaks\":");
  out.generation_peak = (long long)test::json_number(run.output, "generation", peaks);
  out.training_peak = (long long)test::json_number(run.output, "training", peaks);
  std::ifstream file(dir + "/log.txt");
  const std::string log((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  out.intra = log_counter(log, "intra-node bytes (all ranks)");
  out.inter = log_counter(log, "inter-node bytes (all ranks)");
  const auto report = test::run_rlfusion("report " + dir + " --json");
  EXPECT_EQ(report.exit_code, 0) << report.output;
  out.tokens =
      (long long)test::json_number(report.output, "tokens", report.output.find("\"total\":"));
  out.response_tokens = (long long)test::json_number(report.output, "tokens",
                                                     report.output.find("\"phase\":\"generate\""));
  return out;
}

long long kind_sum(const RunBytes& r) {
  long long sum = 0;
  for (const auto& [kind, bytes] : r.by_kind) sum += bytes;
  return sum;
}

// A validate_planner.sh row for a fused tiny run of the options above on `ranks` ranks (times made
// up: the bytes and rank 0's memory peaks are checked here).
std::string measured_row(const std::string& name, int ranks, const std::string& layout,
                         int redundant, int pipeline, int generation_pipeline, const RunBytes& r,
                         int tensor = 1, int actor_tensor = 0) {
  std::ostringstream row;
  row << name << "," RLFUSION_SOURCE_DIR "/inputs/clusters/cloudmatrix-384.ini,sort,tiny,fused,"
      << ranks << ",1,0," << layout << "," << r.staleness << ",0,0,0,8,4,4,0,2,3," << r.tokens
      << "," << r.response_tokens << ",0.01," << r.intra << "," << r.inter << ","
      << r.generation_peak << "," << r.training_peak << ",0.004,0.006,1," << redundant << ","
      << (redundant > 0 ? 1 : 0) << ",0," << pipeline << "," << generation_pipeline << ","
      << r.migrations << "," << r.decode_steps << "," << tensor << "," << actor_tensor << ","
      << r.trace << "," << r.lanes;
  for (const std::string& kind : kind_names())
    row << "," << (r.by_kind.count(kind) ? r.by_kind.at(kind) : 0);
  return row.str() + "\n";
}

TEST(TrafficKinds, AddUpToTheCountersAndArePredictedWhereARuleFixesThem) {
  const RunBytes ep =
      run_and_count("ep", "--mode fused --expert-parallel 2 --actor-expert-parallel 2");
  const RunBytes pp =
      run_and_count("pp", "--mode fused --pipeline-parallel 2 --actor-pipeline-parallel 1");
  const RunBytes disaggregated = run_and_count("disaggregated", "--mode disaggregated");
  // EDPB's spare slot on each rank: its replica copied in at the start, replicas' gradients
  // summed every step (no migration in 3 steps: the first decision comes later).
  const RunBytes spare = run_and_count(
      "spare", "--mode fused --expert-parallel 2 --actor-expert-parallel 2 --redundant-experts 1");
  // PP 2 x 2 pipelines with EP 2 over the pipelines and a spare slot per EP rank: the stages'
  // gradient sums, borrowed layers, spare slots and final gather all with their experts.
  const RunBytes pipeline_experts = run_and_count(
      "pipeline_experts",
      "--mode fused --pipeline-parallel 2 --actor-pipeline-parallel 1 --expert-parallel 2 "
      "--actor-expert-parallel 2 --redundant-experts 1",
      4);
  // Generation inside the pipeline: its groups' decode steps recorded, its bytes predicted.
  const RunBytes pipeline_generates = run_and_count(
      "pipeline_generates", "--mode fused --pipeline-parallel 2 --actor-pipeline-parallel 2");
  // StaleSync's pools inside the pipeline: its lanes' steps and rows recorded, their messages and
  // the rollout allgather predicted. (Its memory peaks are left out: a 3-step run's fall short of
  // the expected peak, every slot resumed at once, by more than 5%.)
  RunBytes pool_lanes = run_and_count(
      "pool_lanes", "--mode fused --staleness 1 --pipeline-parallel 2 --actor-pipeline-parallel 2");
  pool_lanes.generation_peak = pool_lanes.training_peak = 0;
  pool_lanes.staleness = 1;
  // TP 2: every layer's all-reduces and the token split's allgathers, the experts' gradients over
  // the TP group, the slices gathered at the end.
  const RunBytes tensor_parallel =
      run_and_count("tensor_parallel", "--mode fused --tensor-parallel 2");
  // Generation at EP 1 after training at EP 2: each rank switches in the experts it lacks.
  const RunBytes switched =
      run_and_count("switched", "--mode fused --expert-parallel 2 --actor-expert-parallel 1");
  for (const RunBytes* r : {&ep, &pp, &disaggregated, &spare, &pipeline_experts, &switched,
                            &pipeline_generates, &tensor_parallel, &std::as_const(pool_lanes)}) {
    EXPECT_EQ(kind_sum(*r), r->intra + r->inter);
    EXPECT_GT(r->inter, 0);
    EXPECT_EQ(r->by_kind.count("other"), 0u) << "every message has its kind";
  }
  EXPECT_GT(ep.by_kind.at("expert_dispatch"), 0);
  EXPECT_GT(ep.by_kind.at("gradient_reduce"), 0);
  EXPECT_GT(pp.by_kind.at("pipeline_activations"), 0);
  EXPECT_GT(pp.by_kind.at("layout_switch"), 0);
  EXPECT_EQ(pp.by_kind.count("gradient_reduce"), 0u) << "one pipeline: no data-parallel peer";
  EXPECT_GT(disaggregated.by_kind.at("weight_sync"), 0);
  EXPECT_GT(disaggregated.by_kind.at("rollout_queue"), 0);
  EXPECT_EQ(spare.migrations, 0);
  EXPECT_GT(spare.by_kind.at("expert_migration"), 0);
  EXPECT_GT(spare.by_kind.at("gradient_reduce"), ep.by_kind.at("gradient_reduce"));
  for (const char* kind : {"gradient_reduce", "expert_migration", "expert_dispatch",
                           "pipeline_activations", "layout_switch", "final_gather"})
    EXPECT_GT(pipeline_experts.by_kind.count(kind) ? pipeline_experts.by_kind.at(kind) : 0, 0)
        << kind;
  EXPECT_GT(switched.by_kind.at("layout_switch"), 0);
  EXPECT_GT(pipeline_generates.by_kind.at("pipeline_generation"), 0);
  EXPECT_GT(pool_lanes.by_kind.at("pipeline_generation"), 0);
  EXPECT_EQ(std::count(pool_lanes.lanes.begin(), pool_lanes.lanes.end(), ' '), 7)
      << "4 counts a stage: " << pool_lanes.lanes;
  EXPECT_GT(pipeline_generates.decode_steps, 0);
  EXPECT_GT(tensor_parallel.by_kind.at("tensor_parallel"), 0);
  EXPECT_EQ(pp.decode_steps, -1) << "generation from borrowed layers";

  const std::string dir = test::fresh_temp_dir("validate");
  std::filesystem::create_directories(dir);
  std::ofstream csv(dir + "/measured.csv");
  csv << "case,cluster,task,model,mode,ranks,ranks_per_node,actors,expert_parallel,"
         "actor_expert_parallel,staleness,offload,inter_bandwidth,inter_latency,prompts,"
         "group_size,micro_batch,reference,queue_shards,steps,trained_tokens,response_tokens,"
         "step_s,intra_bytes,inter_bytes,generation_peak,training_peak,generate_s,train_s,"
         "router_max_over_mean,redundant_experts,rebalance,expert_moves_per_step,"
         "pipeline_parallel,actor_pipeline_parallel,migrations,pipeline_decode_steps,"
         "tensor_parallel,actor_tensor_parallel,trace,pipeline_lanes";
  for (const std::string& kind : kind_names()) csv << ",bytes_" << kind;
  csv << "\n"
      << measured_row("ep", 2, "2,2", 0, 1, 1, ep) << measured_row("pp", 2, "1,1", 0, 2, 1, pp)
      << measured_row("spare", 2, "2,2", 1, 1, 1, spare)
      << measured_row("pipeline_experts", 4, "2,2", 1, 2, 1, pipeline_experts)
      << measured_row("switched", 2, "2,1", 0, 1, 1, switched)
      << measured_row("pipeline_generates", 2, "1,1", 0, 2, 2, pipeline_generates)
      << measured_row("tensor_parallel", 2, "1,1", 0, 1, 1, tensor_parallel, 2)
      << measured_row("pool_lanes", 2, "1,1", 0, 2, 2, pool_lanes);
  csv.close();
  // A TP degree below 1, or one that the validation does not lay out, is refused naming the case.
  struct Refused {
    int tensor, actor_tensor;
    std::string message;
  };
  for (const auto& [tensor, actor_tensor, message] :
       {Refused{0, 0, "case tensor_parallel: tensor_parallel must be 1 or more"},
        Refused{2, -1,
                "case tensor_parallel: actor_tensor_parallel must be 0 (the default) or more"},
        Refused{4, 0,
                "case tensor_parallel: tensor_parallel 4 needs a fused run on a multiple of "
                "tensor_parallel x pipeline_parallel ranks"},
        Refused{2, 3,
                "case tensor_parallel: actor_tensor_parallel 3 needs a fused run on a multiple "
                "of that many ranks, dividing tensor_parallel 2, not generating inside the "
                "pipelines"}}) {
    std::ofstream bad(dir + "/bad.csv");
    std::ifstream good(dir + "/measured.csv");
    std::string header;
    std::getline(good, header);
    bad << header << "\n"
        << measured_row("tensor_parallel", 2, "1,1", 0, 1, 1, tensor_parallel, tensor,
                        actor_tensor);
    bad.close();
    const auto refused = test::run_rlfusion("plan --validate " + dir + "/bad.csv");
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }
  // A trace that is not there, or lanes that are not 4 counts a stage, are refused, naming them.
  RunBytes lost = pp;
  lost.trace = dir + "/no-such-run/trace.h5";
  RunBytes words = pool_lanes, three = pool_lanes;
  words.lanes = "1 2 x 4";
  three.lanes = "1 2 3";
  for (const auto& [bad_run, message] :
       {std::pair{lost, "trace '" + lost.trace + "' does not exist"},
        std::pair{words, std::string("column 'pipeline_lanes' must hold counts, got 'x'")},
        std::pair{three,
                  std::string("column 'pipeline_lanes' must hold 4 counts a stage, got 3")}}) {
    std::ofstream bad(dir + "/bad.csv");
    std::ifstream good(dir + "/measured.csv");
    std::string header;
    std::getline(good, header);
    bad << header << "\n" << measured_row("bad", 2, "1,1", 0, 2, 1, bad_run);
    bad.close();
    const auto refused = test::run_rlfusion("plan --validate " + dir + "/bad.csv");
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }
  const auto validated = test::run_rlfusion("plan --validate " + dir + "/measured.csv");
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_NE(validated.output.find("# bytes: 8 of 8 cases predicted exactly (met)"),
            std::string::npos)
      << validated.output;
  // Rank 0's memory peaks, predicted by the runtime's own plan (PP x EP's too) within 5%.
  EXPECT_NE(validated.output.find("over 7 fused cases (target <= 5%: met)"), std::string::npos)
      << validated.output;
  // The pipelines' rollout hand-offs follow their samples' ids and lengths, from the traces: every
  // kind of the pipeline runs is predicted but the PP x EP run's dispatch (the routing's).
  EXPECT_GT(pipeline_generates.by_kind.at("rollout_queue"), 0);
  EXPECT_EQ(validated.output.find("# pipeline_generates: not predicted"), std::string::npos)
      << validated.output;
  EXPECT_EQ(validated.output.find("# pp: not predicted"), std::string::npos) << validated.output;
  EXPECT_EQ(validated.output.find("# pool_lanes: not predicted"), std::string::npos)
      << validated.output;
  EXPECT_NE(
      validated.output.find("# pipeline_experts: not predicted: expert_dispatch " +
                            std::to_string(pipeline_experts.by_kind.at("expert_dispatch")) + " B"),
      std::string::npos)
      << validated.output;
  EXPECT_NE(validated.output.find("# ep: not predicted: expert_dispatch " +
                                  std::to_string(ep.by_kind.at("expert_dispatch"))),
            std::string::npos)
      << validated.output;
}

}  // namespace
}  // namespace rlf
