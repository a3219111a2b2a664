#include "src/app/plan_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "kernels/error.h"
#include "src/app/fused_memory.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/balance/stage_balance.h"
#include "src/io/trace_reader.h"
#include "src/model/activation_memory.h"
#include "src/model/expert_parallel.h"
#include "src/model/tensor_parallel.h"
#include "src/rl/task.h"
#include "src/runtime/pipeline_generation.h"
#include "src/sim/cost_model.h"
#include "src/sim/counted_bytes.h"
#include "src/sim/dispatch_replay.h"

namespace rlf {

// The planner prices the runtime's pipelined generation: its prefill in as many pieces.
static_assert(sim::kPrefillPieces == kPipelinePrefillPieces,
              "the cost model's prefill pieces differ from generate_pipelined's");

namespace {

using namespace rlf::sim;

// One measured run: the CSV's columns by name.
class Row {
 public:
  Row(std::map<std::string, std::string> fields, std::string where)
      : fields_(std::move(fields)), where_(std::move(where)) {}
  const std::string& text(const std::string& key) const {
    auto it = fields_.find(key);
    if (it == fields_.end()) throw ConfigError(where_ + ": no column '" + key + "'");
    return it->second;
  }
  double number(const std::string& key) const {
    const std::string& t = text(key);
    try {
      size_t used = 0;
      const double v = std::stod(t, &used);
      if (used == t.size() && std::isfinite(v)) return v;
    } catch (const std::exception&) {
    }
    throw ConfigError(where_ + ": column '" + key + "' must be a number, got '" + t + "'");
  }
  int integer(const std::string& key) const { return int(number(key)); }
  // A column older CSVs may lack: `fallback` when absent.
  double number_or(const std::string& key, double fallback) const {
    return fields_.count(key) ? number(key) : fallback;
  }
  std::string text_or(const std::string& key) const {
    return fields_.count(key) ? fields_.at(key) : std::string();
  }
  const std::string& where() const { return where_; }

 private:
  std::map<std::string, std::string> fields_;
  std::string where_;
};

// The trace the row names (its `trace` column; none without one). A trace that cannot be read is
// bad input (ConfigError, naming it).
std::optional<TraceData> row_trace(const Row& row) {
  const std::string path = row.text_or("trace");
  if (path.empty()) return std::nullopt;
  return read_trace(path);
}

// The samples the run trained, once each, from its trace (none: empty). An older trace without
// their lengths gives none either.
std::vector<sim::SampleTokens> trained_samples(const std::optional<TraceData>& trace) {
  if (!trace) return {};
  std::map<int64_t, sim::SampleTokens> by_id;
  for (const std::vector<TrainedSample>& rank : trace->samples)
    for (const TrainedSample& s : rank) {
      if (s.prompt_tokens < 0 || s.response_tokens < 0) return {};
      by_id.emplace(s.sample_id, sim::SampleTokens{s.sample_id, s.prompt_tokens, s.response_tokens,
                                                   s.trained_version});
    }
  std::vector<sim::SampleTokens> samples;
  for (const auto& [id, sample] : by_id) samples.push_back(sample);
  return samples;
}

// StaleSync's lanes inside the pipelines (the `pipeline_lanes` column, summary.json's list
// space-separated: per stage steps, decode rows, prefill sequences, prefill tokens; absent or
// empty: not known).
std::vector<int64_t> pipeline_lanes(const Row& row) {
  std::istringstream in(row.text_or("pipeline_lanes"));
  std::vector<int64_t> lanes;
  for (std::string word; in >> word;) {
    size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || value < 0)
      throw ConfigError(row.where() + ": column 'pipeline_lanes' must hold counts, got '" + word +
                        "'");
    lanes.push_back(value);
  }
  if (lanes.size() % 4 != 0)
    throw ConfigError(row.where() + ": column 'pipeline_lanes' must hold 4 counts a stage, got " +
                      std::to_string(lanes.size()));
  return lanes;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) out.push_back(cell);
  return out;
}

std::vector<Row> read_rows(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ConfigError("--validate: cannot read '" + path + "'");
  std::string line;
  if (!std::getline(file, line)) throw ConfigError("--validate: '" + path + "' is empty");
  const std::vector<std::string> header = split(line);
  std::vector<Row> rows;
  for (int number = 2; std::getline(file, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> cells = split(line);
    const std::string where = path + ":" + std::to_string(number);
    if (cells.size() != header.size())
      throw ConfigError(where + ": " + std::to_string(cells.size()) + " cells, header has " +
                        std::to_string(header.size()));
    std::map<std::string, std::string> fields;
    for (size_t i = 0; i < header.size(); ++i) fields[header[i]] = cells[i];
    rows.emplace_back(std::move(fields), where);
  }
  return rows;
}

struct Outcome {
  std::string name;
  double measured_step = 0, predicted_step = 0;
  // Seconds per step by phase (measured: the busiest rank's trace time; -1: not in the CSV).
  double measured_generation = -1, measured_training = -1;
  Prediction predicted;
  // Link bytes. With the run's bytes per traffic kind (columns bytes_<kind>), over the kinds the
  // rules fix, the others' measured bytes apart (`unpredicted`: "kind bytes" pairs); without, the
  // run's total, compared only where every kind has a rule.
  uint64_t measured_bytes = 0, predicted_bytes = 0, unpredicted_bytes = 0;
  bool bytes_exact_rule = false;
  std::string unpredicted, wrong_kinds;
  double measured_memory = 0, predicted_memory = 0;  // the larger phase peak; 0: not measured
  double router_max_over_mean = 1;  // the run's router concentration (1: none recorded)
  // Rows a token sends to other EP ranks per dispatch: by the run's routing log (-1: none) and
  // by the cost model (a uniform router).
  double routed_remote_rows = -1, model_remote_rows = -1;
};

// The expected peak of a fused pipeline run's rank 0 (stage 0 of the first pipeline), by the
// runtime's own plan (src/app/fused_train.cpp's for a pipeline rank; PP with or without EP or TP,
// one virtual stage, the uniform cut: the validation's pipeline cases) at the task's longest
// lengths where the runtime allocates so (the KV cache, training's micro-batches), and at the
// expected lengths where the peak follows the run's samples: a prefill piece's prompts, at the
// worst of the run's pieces, and with StaleSync a resumed partial's prefix. `batch` is the rank's
// as the data-parallel case gets it (prefill and resumed prefix expected).
size_t pipeline_rank_expected_peak(const ModelConfig& config, const RlJob& job, const Strategy& s,
                                   int ranks, int steps, const FusedBatch& batch) {
  const int p = s.train.pp;
  // make_train_pipeline's shape: every rank trains its own block in --micro-batch pieces.
  const int rank_samples = job.prompts / ranks * job.group_size;
  const PipelineShape shape{p, pipeline_micro_batches(p, rank_samples, job.micro_batch), 1};
  const std::vector<LayerRange> chunks =
      pipeline_rank_chunks(shape, 0, uniform_boundaries(config.n_layers, p));
  // With EP inside the stages rank 0 holds the first EP rank's experts (PipelineGroups::
  // expert_shard), spare slots included; generation at an EP degree of its own switches to the
  // whole model with that degree's first shard.
  const int experts = config.n_experts;
  ExpertShard own = s.train.ep > 1 ? expert_shard_of(0, s.train.ep, experts) : ExpertShard{};
  own.redundant = s.redundant_experts;
  // With TP inside the stages, rank 0 holds TP slice 0 of its stage, its routed experts on its
  // share of the TP group's rows (the token split).
  const int tensor = s.train.tp;
  const bool split = tensor > 1;
  const ParameterLayout stage = with_tensor_slice(
      config, ParameterLayout(config, own, stage_layer_shard(chunks, config.n_layers)),
      TensorSlice{0, tensor, false});
  const bool pipeline_generates = s.generate.pp > 1;
  const bool layout_switch = s.generate.ep != s.train.ep;
  const ParameterLayout generation =
      layout_switch
          ? ParameterLayout(config, s.generate.ep > 1 ? expert_shard_of(0, s.generate.ep, experts)
                                                      : ExpertShard{})
      : pipeline_generates ? stage
                           : with_tensor_slice(config, ParameterLayout(config, own),
                                               TensorSlice{0, s.generate.tp, false});
  // (Its generation TP group splits the tokens: the runtime's fit check counts them unsplit.)
  FusedMemoryPlan plan = plan_fused_memory(
      config, stage, generation, layout_switch, job.reference, nullptr, s.offload, batch,
      /*experts_migrate=*/false, ExpertTokenSplit{false, !pipeline_generates && s.generate.tp > 1});
  if (pipeline_generates) {
    // Each stage caches its layers' KV for the pipeline's samples and runs one group (a rank's
    // samples) at a time, its prompts in pieces: the worst piece of the run's steps x pieces,
    // each piece / group_size distinct prompts (a group's samples share its prompt).
    const int pipeline_samples = p * batch.samples;
    int group = batch.samples;
    const int pieces = pipeline_prefill_pieces(group, /*expert_parallel=*/s.train.ep > 1);
    int piece = (group + pieces - 1) / pieces;
    int piece_length = int(std::lround(
        expected_worst_phase_mean(job.prompt, steps * pieces, double(piece) / job.group_size)));
    if (s.staleness > 0) {  // a pool's step may prefill every slot with a resumed prefix
      group = piece = batch.samples;
      piece_length = std::max(batch.longest_prompt, batch.longest_prefill);
    }
    plan.generation_activations =
        pipeline_generation_peak_bytes(config, stage, uniform_batch(piece, piece_length), group,
                                       pipeline_samples, batch.max_sequence, batch.sampled, split);
  } else if (split || s.generate.tp > 1) {
    // TP training generating from borrowed layers, or generation at a TP degree of its own: a
    // whole model of its own (every layer with the pipeline's experts, at its generation slice),
    // into which the stages' slices are assembled.
    add_pipeline_generation_model(plan, generation.total());
  } else {
    // Generation data-parallel from a stitched view: the other stages' layers borrowed (with EP
    // those of the pipeline's experts).
    add_pipeline_generation_model(
        plan,
        ParameterLayout(config, own, other_stages_layer_shard(stage.layer_shard(), config.n_layers))
            .total());
  }
  const int sequences = std::min(job.micro_batch, rank_samples);
  add_pipeline_activations(plan, pipeline_activation_bytes(config, shape, 0, chunks, stage,
                                                           sequences, batch.max_sequence, split));
  return std::max(plan.training_peak(), plan.generation_peak());
}

// The routed experts' parameters a layout stores.
int64_t routed_parameters(const ParameterLayout& layout) {
  int64_t routed = 0;
  for (const ParameterTensor& tensor : layout.tensors())
    if (tensor.routed_expert) routed += tensor.numel;
  return routed;
}

// The run's link bytes against the rules' (Outcome's bytes fields).
void compare_bytes(const Row& row, const CountedBytes& counted, Outcome& out) {
  const bool by_kind =
      row.number_or(std::string("bytes_") + traffic_kind_name(TrafficKind::GradientReduce), -1) >=
      0;
  if (!by_kind) {  // (a CSV from before the runtime counted bytes by kind)
    out.predicted_bytes = counted.intra() + counted.inter();
    out.bytes_exact_rule = counted.exact();
    out.measured_bytes = uint64_t(row.number("intra_bytes") + row.number("inter_bytes"));
    return;
  }
  out.bytes_exact_rule = true;
  for (const TrafficKind kind : all_traffic_kinds()) {
    const std::string name = traffic_kind_name(kind);
    const uint64_t measured = uint64_t(row.number_or("bytes_" + name, 0));
    const KindBytes& predicted = counted[kind];
    if (!predicted.exact) {
      out.unpredicted_bytes += measured;
      out.unpredicted +=
          (out.unpredicted.empty() ? "" : ", ") + name + " " + std::to_string(measured);
      continue;
    }
    out.measured_bytes += measured;
    out.predicted_bytes += predicted.total();
    if (measured != predicted.total()) {
      out.wrong_kinds += (out.wrong_kinds.empty() ? "" : ", ") + name + " " +
                         std::to_string(measured) + " measured, " +
                         std::to_string(predicted.total()) + " predicted";
    }
  }
}

Outcome validate_row(const Row& row) {
  Outcome out;
  out.name = row.text("case");
  const ModelConfig config = load_model_config(row.text("model"));
  const ModelShape model = model_shape(config);
  const std::unique_ptr<Task> task = make_task(load_task_config(row.text("task"), 1));
  const Mode mode = parse_mode(row.text("mode"), "column mode");
  const int ranks = row.integer("ranks");
  const int rpn = std::max(1, std::min(ranks, row.integer("ranks_per_node")));
  const int actors = row.integer("actors");
  const int steps = row.integer("steps");

  // The machine as `bench calibrate` measured it for this case (column `cluster`: with the case's
  // link emulation when it has one, so the link between virtual nodes is the measured emulated
  // one), laid out as the run was: each rank a device, virtual nodes of ranks_per_node ranks.
  ClusterConfig cluster = load_cluster_config(row.text("cluster"));
  cluster.devices_per_node = rpn;
  cluster.nodes_per_supernode = std::max(1, ranks / rpn);
  cluster.supernodes = 1;

  RlJob job;
  job.name = out.name;
  job.prompts = row.integer("prompts");
  job.group_size = row.integer("group_size");
  job.micro_batch = row.integer("micro_batch");
  job.reference = row.integer("reference") != 0;
  // The run's router concentration (its trace's router statistics: EP runs only), 1 without.
  job.router_max_over_mean = row.number_or("router_max_over_mean", 1);
  // The routed experts a training call touched (summary.json's active_experts_per_call; column
  // absent or 0: as a uniform router touches them).
  job.active_experts = row.number_or("active_experts", 0);
  check_router_concentration(job, config.n_experts, config.top_k, "case " + out.name);
  out.router_max_over_mean = job.router_max_over_mean;
  // EDPB's moves after its first placement (`report --json`'s expert_moves_per_step; column
  // absent: none, a static router).
  job.expert_moves_per_step = row.number_or("expert_moves_per_step", 0);
  check_expert_moves_per_step(job, "case " + out.name);
  const double samples = double(job.samples()) * steps;
  const double response = row.number("response_tokens") / samples;
  const double prompt = (row.number("trained_tokens") - row.number("response_tokens")) / samples;
  const int longest_prompt = 1 + task->max_prompt_chars();
  const int longest_response = 1 + task->max_response_chars();
  job.prompt = summarize_mean_longest(prompt, longest_prompt, job.finish_threshold);
  job.response = summarize_mean_longest(response, longest_response, job.finish_threshold);

  Strategy s;
  s.mode = ranks == 1 ? Mode::Fused : mode;
  // The runs dispatch hierarchically (train's default --ep-dispatch): a token's row leaves its
  // rank once per other owner (once per node across nodes), the planner's de-duplicated dispatch.
  s.dispatch = Dispatch::Dedup;
  s.staleness = row.integer("staleness");
  s.offload = row.integer("offload") != 0;
  if (s.mode == Mode::Disaggregated) {
    s.train.dp = ranks - actors;
    s.generate.dp = actors;
    s.train.ep = row.integer("expert_parallel");
    s.generate.ep = row.integer("actor_expert_parallel");
  } else {
    s.train.dp = s.generate.dp = ranks;
    s.train.ep = row.integer("expert_parallel");
    s.generate.ep = row.integer("actor_expert_parallel");
  }
  // Pipeline parallelism (columns absent: none): PP stages of consecutive ranks training, and
  // generation data-parallel (borrowing the other stages' layers) or inside the pipelines.
  const int pipeline = int(row.number_or("pipeline_parallel", 1));
  const int generation_pipeline = int(row.number_or("actor_pipeline_parallel", 1));
  if (pipeline > 1) {
    if (s.mode == Mode::Disaggregated || ranks % pipeline != 0 ||
        (generation_pipeline != 1 && generation_pipeline != pipeline)) {
      throw ConfigError("case " + out.name + ": pipeline_parallel " + std::to_string(pipeline) +
                        " needs a fused run on a multiple of that many ranks, and "
                        "actor_pipeline_parallel 1 or the same");
    }
    s.train.pp = pipeline;
    s.train.dp = ranks / pipeline;
    if (generation_pipeline > 1) {
      s.generate.pp = pipeline;
      s.generate.dp = ranks / pipeline;
    }
  }
  // Tensor parallelism (columns absent: none): TP groups of consecutive ranks (TP innermost).
  // Fused: data-parallel (with EP, expert-parallel; with PP, pipelines of TP groups) over the
  // groups, the routed experts on each rank's share of the rows (the runtime's defaults),
  // generating at actor_tensor_parallel (`train --actor-tensor-parallel`; 0 or absent: the
  // training TP degree, or TP 1 in a pipeline generating from borrowed layers). Disaggregated: the
  // learners' TP groups (tensor_parallel) and the actors' (actor_tensor_parallel; 0: none).
  const int tensor = int(row.number_or("tensor_parallel", 1));
  const int actor_tensor = int(row.number_or("actor_tensor_parallel", 0));
  if (tensor < 1) {
    throw ConfigError("case " + out.name + ": tensor_parallel must be 1 or more, got " +
                      std::to_string(tensor));
  }
  if (actor_tensor < 0) {
    throw ConfigError("case " + out.name +
                      ": actor_tensor_parallel must be 0 (the default) or more, got " +
                      std::to_string(actor_tensor));
  }
  // The generation TP degree: the actors' (disaggregated) or the fused generation's.
  const int generation_tensor = actor_tensor > 0                           ? actor_tensor
                                : s.mode == Mode::Disaggregated            ? 1
                                : pipeline == 1 || generation_pipeline > 1 ? tensor
                                                                           : 1;
  if (s.mode == Mode::Disaggregated) {
    if ((ranks - actors) % tensor != 0 || actors % generation_tensor != 0) {
      throw ConfigError("case " + out.name + ": tensor_parallel " + std::to_string(tensor) +
                        " and actor_tensor_parallel " + std::to_string(generation_tensor) +
                        " must divide the " + std::to_string(ranks - actors) + " learners and " +
                        std::to_string(actors) + " actors");
    }
    s.train.tp = tensor;
    s.train.dp = (ranks - actors) / tensor;
    s.generate.tp = generation_tensor;
    s.generate.dp = actors / generation_tensor;
  } else {
    if (ranks % (tensor * pipeline) != 0) {
      throw ConfigError("case " + out.name + ": tensor_parallel " + std::to_string(tensor) +
                        " needs a fused run on a multiple of tensor_parallel x pipeline_parallel "
                        "ranks");
    }
    if (actor_tensor > 0 && (generation_pipeline > 1 || ranks % actor_tensor != 0 ||
                             (tensor > 1 && tensor % actor_tensor != 0))) {
      throw ConfigError("case " + out.name + ": actor_tensor_parallel " +
                        std::to_string(actor_tensor) +
                        " needs a fused run on a multiple of that many ranks, dividing "
                        "tensor_parallel " +
                        std::to_string(tensor) + ", not generating inside the pipelines");
    }
    s.train.tp = tensor;
    s.train.dp = ranks / (tensor * pipeline);
    s.generate.tp = generation_tensor;
    s.generate.dp = ranks / (generation_tensor * (generation_pipeline > 1 ? pipeline : 1));
  }
  // EDPB's spare expert slots per EP rank (column absent in older CSVs: none), and its rebalancing
  // (column absent: on with spare slots, as the validation's replica case runs it).
  s.redundant_experts = int(row.number_or("redundant_experts", 0));
  s.rebalance = row.number_or("rebalance", s.redundant_experts > 0 ? 1 : 0) != 0;
  if (s.redundant_experts > 0 && !feasible(config, job, s)) {
    throw ConfigError("case " + out.name + ": redundant_experts " +
                      std::to_string(s.redundant_experts) +
                      " needs expert parallelism and E / EP + R <= E");
  }
  out.predicted = predict(model, cluster, job, s);
  out.predicted_step = out.predicted.step;
  out.measured_step = row.number("step_s");
  out.measured_generation = row.number_or("generate_s", -1);
  out.measured_training = row.number_or("train_s", -1);

  RuntimeRun run;
  run.mode = s.mode;
  run.ranks = ranks;
  run.ranks_per_node = rpn;
  run.actors = actors;
  run.queue_shards = row.integer("queue_shards");
  run.expert_parallel = s.train.ep;
  run.actor_expert_parallel = s.generate.ep;
  run.redundant_experts = s.redundant_experts;
  // (summary.json's migrations; a CSV without the column: any run that rebalanced may have.)
  const double migrations = row.number_or("migrations", -1);
  run.migrated = migrations > 0 || (migrations < 0 && s.rebalance);
  run.pipeline_parallel = pipeline;
  run.actor_pipeline_parallel = generation_pipeline;
  run.staleness = s.staleness;
  run.steps = steps;
  run.samples_per_step = job.samples();
  run.group_size = job.group_size;
  run.parameters = config.parameter_count();
  run.routed_parameters = int64_t(model.routed);
  run.experts = config.n_experts;
  run.d_model = config.d_model;
  run.layers = config.n_layers;
  run.top_k = config.top_k;
  run.tensor_parallel = tensor;
  if (s.mode == Mode::Disaggregated) {
    run.actor_tensor_parallel = generation_tensor;
  } else {
    run.generation_tensor_parallel = actor_tensor;
  }
  if (const int degree = std::max(tensor, generation_tensor); degree > 1) {
    // The cut tensors' elements: what a rank stores less than the whole model is (T - 1) / T of
    // them.
    const ParameterLayout whole(config);
    const int64_t rank_stores =
        with_tensor_slice(config, whole, TensorSlice{0, degree, false}).total();
    run.shared_expert_cut = config.shared_expert_d_ff > 0;
    run.tensor_cut_parameters = (whole.total() - rank_stores) * degree / (degree - 1);
  }
  if (pipeline > 1) {
    // The uniform cut's stages, as make_train_pipeline builds them without --pipeline-balance.
    const std::vector<int> cut = uniform_boundaries(config.n_layers, pipeline);
    for (int stage = 0; stage < pipeline; ++stage) {
      const std::vector<LayerRange> chunks =
          pipeline_rank_chunks(PipelineShape{pipeline, 1, 1}, stage, cut);
      const ParameterLayout layout(config, ExpertShard{},
                                   stage_layer_shard(chunks, config.n_layers));
      run.stage_parameters.push_back(layout.total());
      run.stage_routed_parameters.push_back(routed_parameters(layout));
      if (const int degree = std::max(tensor, generation_tensor); degree > 1) {
        const int64_t rank_stores =
            with_tensor_slice(config, layout, TensorSlice{0, degree, false}).total();
        run.stage_tensor_cut_parameters.push_back((layout.total() - rank_stores) * degree /
                                                  (degree - 1));
      }
    }
  }
  run.trained_tokens = int64_t(row.number("trained_tokens"));
  run.response_tokens = int64_t(row.number("response_tokens"));
  run.pipeline_decode_steps = int64_t(row.number_or("pipeline_decode_steps", -1));
  run.pipeline_lanes = pipeline_lanes(row);
  run.pool_generation_rows = int64_t(row.number_or("pool_generation_rows", -1));
  run.vocab = config.vocab_size;
  const std::optional<TraceData> trace = row_trace(row);
  run.samples = trained_samples(trace);
  // Every rank's routing log, when the run recorded one (train --trace-routing: a rank without
  // an EP group has an empty log), replayed once.
  if (trace && std::any_of(trace->routing.begin(), trace->routing.end(),
                           [](const std::vector<int32_t>& log) { return !log.empty(); })) {
    try {
      run.routing = sim::replay_dispatch_bytes(trace->routing);
    } catch (const std::runtime_error& e) {  // a malformed routing log
      throw ConfigError("case " + out.name + ": trace '" + row.text_or("trace") + "': " + e.what());
    }
  }
  compare_bytes(row, counted_bytes(run), out);
  // The dispatch volume the time model takes against the routing's, where one EP degree does
  // both phases.
  if (run.routing && s.train.ep == s.generate.ep) {
    const sim::ReplayedDispatch& routed = *run.routing;
    if (routed.tokens > 0) {
      out.routed_remote_rows = double(routed.remote_rows) / double(routed.tokens);
      out.model_remote_rows = remote_owners(s.train.ep, config.top_k, config.n_experts);
    }
  }

  if (s.mode != Mode::Disaggregated && ranks > 1) {
    // The fused runtime's own plan (src/app/fused_memory.h) at the task's longest lengths, for
    // rank 0, whose peaks the run reports.
    // The expected peak, where the runtime's own check takes the bound: the KV cache at the
    // longest sequence (allocated so), a prefill packing the worst phase's prompts (not the
    // longest): the peak is the largest of `steps` phases, each the rank's prompts' mean (their
    // group_size samples share a prompt), so expected at E[max of `steps` normals] standard
    // deviations of that mean above the mean prompt, rounded to a whole prompt; with StaleSync
    // the pool re-prefills the partials it resumes, and at the cut every slot is in flight
    // (continuous batching keeps them full), each an expected half of the mean response past its
    // prompt.
    // (A TP group generates its replica's prompts together: ranks / TP blocks; a TP x PP run
    // generating from borrowed layers generates at TP 1 on every rank.)
    const int blocks = s.generate.tp > 1 ? ranks / s.generate.tp : ranks;
    const int prefill = int(
        std::lround(expected_worst_phase_mean(job.prompt, steps, double(job.prompts) / blocks)));
    const int resumed_prefix = int(std::ceil(prompt + 0.5 * response));
    // The longest sequence as the runtime bounds it (fused_train.cpp's `longest`: <bos>, the
    // longest prompt and response, <eos>; one token more until the twenty-second session put the
    // fused cases' predictions 0.1-2.5% over).
    const FusedBatch batch{job.prompts / blocks * job.group_size,
                           prefill,
                           longest_prompt + longest_response,
                           job.micro_batch,
                           true,
                           s.staleness > 0 ? resumed_prefix : 0};
    if (pipeline > 1) {
      out.predicted_memory =
          double(pipeline_rank_expected_peak(config, job, s, ranks, steps, batch));
    } else {
      const int ep = s.train.ep, gen_ep = s.generate.ep;
      ExpertShard own = ep > 1 ? expert_shard_of(0, ep, config.n_experts) : ExpertShard{};
      own.redundant = s.redundant_experts;  // the training slots (generation's too at its layout)
      const ExpertShard gen =
          gen_ep > 1 ? expert_shard_of(0, gen_ep, config.n_experts) : ExpertShard{};
      // With TP rank 0 holds its slice of the cut tensors, trains and generates on it, its routed
      // experts on its share of the rows (the token split).
      const TensorSlice slice{0, tensor, false};
      const ParameterLayout training =
          with_tensor_slice(config, ParameterLayout(config, own), slice);
      // Generation at a TP degree of its own: a model of its own for the phase (fused_train.cpp:
      // regrouped slices, or cut from the whole model at TP 1), its generation slice with the
      // training experts; its generation TP group splits the tokens (the runtime's fit check
      // counts them unsplit, an upper bound: 11-15% over the runs' peaks at generation TP 2).
      const bool own_generation_model = generation_tensor != tensor;
      const ParameterLayout generation = with_tensor_slice(
          config, ParameterLayout(config, own_generation_model ? own : gen),
          own_generation_model ? TensorSlice{0, generation_tensor, false} : slice);
      FusedMemoryPlan plan = plan_fused_memory(
          config, training, generation, ep != gen_ep, job.reference, nullptr, s.offload, batch,
          /*experts_migrate=*/false, ExpertTokenSplit{tensor > 1, generation_tensor > 1});
      if (own_generation_model) add_pipeline_generation_model(plan, generation.total());
      out.predicted_memory = double(std::max(plan.training_peak(), plan.generation_peak()));
    }
    out.measured_memory = std::max(row.number("generation_peak"), row.number("training_peak"));
  }
  return out;
}

// Where the time goes: each phase measured (the busiest rank's trace time per step) beside its
// prediction, with the sampler's and the optimizer's shares of the prediction and training's EP
// exchanges and waits (train EP: part of train pred.; generation's are inside gen pred.).
void print_parts(const std::vector<Outcome>& outcomes) {
  std::printf("# time by part\n# %-26s %10s %10s %10s %10s %10s %10s %10s\n", "case", "gen meas.",
              "gen pred.", "sampler", "train meas.", "train pred.", "optimizer", "train EP");
  std::printf("# %-26s %10s %10s %10s %10s %10s %10s %10s\n", "", "(ms/step)", "(ms/step)",
              "(ms/step)", "(ms/step)", "(ms/step)", "(ms/step)", "(ms/step)");
  for (const Outcome& o : outcomes) {
    const Prediction& p = o.predicted;
    char generation[32] = "-", training[32] = "-";
    if (o.measured_generation >= 0)
      std::snprintf(generation, sizeof generation, "%.3f", 1e3 * o.measured_generation);
    if (o.measured_training >= 0)
      std::snprintf(training, sizeof training, "%.3f", 1e3 * o.measured_training);
    const double trained = p.training_total();
    std::printf("  %-26s %10s %10.3f %10.3f %10s %10.3f %10.3f %10.3f\n", o.name.c_str(),
                generation, 1e3 * p.generation, 1e3 * p.sampler, training, 1e3 * trained,
                1e3 * p.optimizer, 1e3 * (p.all_to_all + p.expert_wait));
  }
}

// The same for --json: every predicted part of the step (seconds; the sampler's and the
// optimizer's shares apart) and the measured phases (null where the row has none).
void print_parts_json(const Outcome& o) {
  std::printf("\"predicted_parts_s\":");
  print_step_parts_json(o.predicted);
  std::printf(",\"predicted_sampler_s\":%.6g,\"predicted_optimizer_s\":%.6g", o.predicted.sampler,
              o.predicted.optimizer);
  const std::pair<const char*, double> measured[] = {{"measured_generate_s", o.measured_generation},
                                                     {"measured_train_s", o.measured_training}};
  for (const auto& [key, value] : measured) {
    if (value >= 0) {
      std::printf(",\"%s\":%.6g", key, value);
    } else {
      std::printf(",\"%s\":null", key);
    }
  }
}

}  // namespace

void print_step_parts_json(const sim::Prediction& p) {
  const auto parts = step_parts(p);
  std::printf("{");
  for (size_t i = 0; i < parts.size(); ++i)
    std::printf("%s\"%s\":%.6g", i ? "," : "", parts[i].name, parts[i].seconds);
  std::printf("}");
}

int run_plan_validation(const std::string& csv_path, bool json) {
  std::vector<Outcome> outcomes;
  for (const Row& row : read_rows(csv_path)) outcomes.push_back(validate_row(row));
  if (outcomes.empty()) throw ConfigError("--validate: '" + csv_path + "' holds no case");
  double sum_error = 0, worst = 0, worst_memory = 0;
  int exact = 0, exact_rules = 0, memory_cases = 0;
  if (!json) {
    std::printf("# rlfusion plan --validate %s (each case on its calibrated cluster file)\n",
                csv_path.c_str());
    std::printf("# %-26s %10s %10s %8s %14s %14s %7s %12s %10s %10s %7s\n", "case", "measured",
                "predicted", "error", "bytes meas.", "bytes pred.", "bytes", "not pred.",
                "mem meas.", "mem pred.", "error");
    std::printf("# %-26s %10s %10s %8s %14s %14s %7s %12s %10s %10s %7s\n", "", "(ms/step)",
                "(ms/step)", "(%)", "(B)", "(B)", "", "(B)", "(MiB)", "(MiB)", "(%)");
  } else {
    std::printf("{\"command\":\"plan\",\"validate\":\"%s\",\"cases\":[", csv_path.c_str());
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Outcome& o = outcomes[i];
    const double error = 100 * (o.predicted_step - o.measured_step) / o.measured_step;
    sum_error += std::abs(error);
    worst = std::max(worst, std::abs(error));
    const bool equal = o.predicted_bytes == o.measured_bytes && o.wrong_kinds.empty();
    if (o.bytes_exact_rule) {
      ++exact_rules;
      exact += equal ? 1 : 0;
    }
    const char* verdict = !o.bytes_exact_rule ? "n/a" : equal ? "EXACT" : "WRONG";
    double memory_error = 0;
    if (o.measured_memory > 0) {
      ++memory_cases;
      memory_error = 100 * (o.predicted_memory - o.measured_memory) / o.measured_memory;
      worst_memory = std::max(worst_memory, std::abs(memory_error));
    }
    if (json) {
      std::printf(
          "%s{\"case\":\"%s\",\"measured_step_s\":%.6g,\"predicted_step_s\":%.6g,"
          "\"error_pct\":%.3f,\"measured_bytes\":%llu,\"predicted_bytes\":%llu,"
          "\"bytes\":\"%s\",\"unpredicted_bytes\":%llu,\"unpredicted_kinds\":\"%s\","
          "\"measured_memory\":%.6g,\"predicted_memory\":%.6g,",
          i ? "," : "", o.name.c_str(), o.measured_step, o.predicted_step, error,
          (unsigned long long)o.measured_bytes, (unsigned long long)o.predicted_bytes, verdict,
          (unsigned long long)o.unpredicted_bytes, o.unpredicted.c_str(), o.measured_memory,
          o.predicted_memory);
      print_parts_json(o);
      std::printf("}");
      continue;
    }
    char mem[3][32] = {"-", "-", "-"};
    if (o.measured_memory > 0) {
      std::snprintf(mem[0], 32, "%.2f", o.measured_memory / (1 << 20));
      std::snprintf(mem[1], 32, "%.2f", o.predicted_memory / (1 << 20));
      std::snprintf(mem[2], 32, "%+.1f", memory_error);
    }
    std::printf("  %-26s %10.3f %10.3f %+8.1f %14llu %14llu %7s %12llu %10s %10s %7s\n",
                o.name.c_str(), 1e3 * o.measured_step, 1e3 * o.predicted_step, error,
                (unsigned long long)o.measured_bytes, (unsigned long long)o.predicted_bytes,
                verdict, (unsigned long long)o.unpredicted_bytes, mem[0], mem[1], mem[2]);
  }
  const double mean = sum_error / double(outcomes.size());
  if (json) {
    std::printf(
        "],\"mean_abs_error_pct\":%.3f,\"worst_abs_error_pct\":%.3f,\"bytes_exact\":%d,"
        "\"bytes_exact_cases\":%d,\"worst_memory_error_pct\":%.3f}\n",
        mean, worst, exact, exact_rules, worst_memory);
    return 0;
  }
  std::printf(
      "# step time: mean |error| %.1f%% (target <= 10%%: %s), worst %.1f%% (target <= "
      "20%%: %s), %zu cases\n",
      mean, mean <= 10 ? "met" : "NOT met", worst, worst <= 20 ? "met" : "NOT met",
      outcomes.size());
  std::printf(
      "# bytes: %d of %d cases predicted exactly (%s), over the traffic kinds a rule fixes; not "
      "pred.: the timing (rollout_queue with several learners outside TP groups: they ask "
      "again until the puts arrive), or a row without the records a rule takes (the trace's "
      "sample lengths; its routing log, for expert dispatch and what follows EDPB's placement; "
      "pipeline_decode_steps, pipeline_lanes, pool_generation_rows), measured\n",
      exact, exact_rules, exact == exact_rules ? "met" : "NOT met");
  for (const Outcome& o : outcomes) {
    if (!o.unpredicted.empty())
      std::printf("# %s: not predicted: %s B\n", o.name.c_str(), o.unpredicted.c_str());
    if (!o.wrong_kinds.empty())
      std::printf("# %s: WRONG: %s B\n", o.name.c_str(), o.wrong_kinds.c_str());
  }
  std::printf("# memory: worst |error| %.1f%% over %d fused cases (target <= 5%%: %s)\n",
              worst_memory, memory_cases, worst_memory <= 5 ? "met" : "NOT met");
  for (const Outcome& o : outcomes) {
    if (o.router_max_over_mean != 1)
      std::printf("# %s: router concentration %.3f (the busiest expert over the mean, its trace)\n",
                  o.name.c_str(), o.router_max_over_mean);
  }
  for (const Outcome& o : outcomes) {
    if (o.routed_remote_rows >= 0 && o.model_remote_rows > 0) {
      std::printf(
          "# %s: rows a token sends to other EP ranks per dispatch: %.4f by its routing log, %.4f "
          "by the model (a uniform router; %+.1f%%)\n",
          o.name.c_str(), o.routed_remote_rows, o.model_remote_rows,
          100 * (o.model_remote_rows / o.routed_remote_rows - 1));
    }
  }
  print_parts(outcomes);
  return 0;
}

}  // namespace rlf
