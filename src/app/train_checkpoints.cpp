#include "src/app/train_checkpoints.h"

#include <array>
#include <boost/program_options.hpp>
#include <csignal>
#include <stdexcept>

#include "kernels/error.h"
#include "src/app/pipeline_expert_checkpoint.h"
#include "src/app/train_rebalance.h"
#include "src/model/expert_parallel.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal) {
  g_stop_signal = signal;
}

const std::vector<InFlightSample> kNothingInFlight;

constexpr size_t kBuffers = 4;  // parameters, first moment, second moment, reference

std::array<float*, kBuffers> buffers_of(const TrainingState& state) {
  return {state.model->parameters(), state.optimizer->first_moment(),
          state.optimizer->second_moment(),
          state.reference ? state.reference->parameters() : nullptr};
}

CheckpointTensors tensors_of(const std::array<float*, kBuffers>& b) {
  return {b[0], b[1], b[2], b[3]};
}

// The training state's buffers, each assembled by `gather` (this rank's part -> the whole-model
// buffer laid out by `whole_layout`; collective over the model replica). Null buffers stay empty.
// With `assembles` false this rank only sends (`gather` gets a null whole buffer) and every
// buffer stays empty.
std::array<std::vector<float>, kBuffers> gather_whole_buffers(
    const TrainingState& state, const ParameterLayout& whole_layout,
    const std::function<void(const float* part, float* whole)>& gather, bool assembles = true) {
  const std::array<float*, kBuffers> parts = buffers_of(state);
  std::array<std::vector<float>, kBuffers> whole;
  for (size_t b = 0; b < kBuffers; ++b) {
    if (!parts[b]) continue;
    if (assembles) whole[b].resize(size_t(whole_layout.total()));
    gather(parts[b], assembles ? whole[b].data() : nullptr);
  }
  return whole;
}

// Every rank's in-flight samples on rank 0 of `comm` (index: rank; empty elsewhere). Flattened
// into three arrays per rank: a row of integers per sample, the tokens, the log-probs.
std::vector<std::vector<InFlightSample>> gather_in_flight(const std::vector<InFlightSample>& mine,
                                                          MPI_Comm comm) {
  const PackedInFlight packed = PackedInFlight::pack(mine);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Counts first (row values, tokens), then the three arrays with MPI_Gatherv.
  const int counts[2] = {int(packed.rows.size()), int(packed.tokens.size())};
  std::vector<int> all_counts(static_cast<size_t>(2 * size));
  MPI_Gather(counts, 2, MPI_INT, all_counts.data(), 2, MPI_INT, 0, comm);
  std::vector<int> row_counts(static_cast<size_t>(size)), token_counts(row_counts);
  std::vector<int> row_offsets(row_counts), token_offsets(row_counts);
  int row_total = 0, token_total = 0;
  for (int r = 0; r < size; ++r) {
    row_counts[size_t(r)] = all_counts[size_t(2 * r)];
    token_counts[size_t(r)] = all_counts[size_t(2 * r + 1)];
    row_offsets[size_t(r)] = row_total;
    token_offsets[size_t(r)] = token_total;
    row_total += row_counts[size_t(r)];
    token_total += token_counts[size_t(r)];
  }
  PackedInFlight all;
  if (rank == 0) {
    all.rows.resize(size_t(row_total));
    all.tokens.resize(size_t(token_total));
    all.logp.resize(size_t(token_total));
  }
  MPI_Gatherv(packed.rows.data(), counts[0], MPI_INT64_T, all.rows.data(), row_counts.data(),
              row_offsets.data(), MPI_INT64_T, 0, comm);
  MPI_Gatherv(packed.tokens.data(), counts[1], MPI_INT32_T, all.tokens.data(), token_counts.data(),
              token_offsets.data(), MPI_INT32_T, 0, comm);
  MPI_Gatherv(packed.logp.data(), counts[1], MPI_FLOAT, all.logp.data(), token_counts.data(),
              token_offsets.data(), MPI_FLOAT, 0, comm);
  std::vector<std::vector<InFlightSample>> by_rank;
  if (rank != 0) return by_rank;
  for (int r = 0; r < size; ++r) {
    by_rank.push_back(PackedInFlight::unpack(
        all.rows.data() + row_offsets[size_t(r)], size_t(row_counts[size_t(r)]),
        all.tokens.data() + token_offsets[size_t(r)], all.logp.data() + token_offsets[size_t(r)]));
  }
  return by_rank;
}

}  // namespace

po::options_description checkpoint_options_description(CheckpointOptions& options) {
  po::options_description d("Checkpoints");
  auto add = d.add_options();
  add("checkpoint-every", po::value(&options.every)->default_value(options.every),
      "write a checkpoint into RUN_DIR/checkpoints every this many RL steps (0: only when "
      "SIGTERM or SIGUSR1 arrives, which also stops the run with exit code 3)");
  add("resume", po::value(&options.resume),
      "continue from a checkpoint: auto (RUN_DIR/checkpoints/latest, or the newest valid one; "
      "from scratch when there is none) or a checkpoint file");
  return d;
}

void validate_checkpoint_options(const CheckpointOptions& options) {
  if (options.every < 0) {
    throw ConfigError("--checkpoint-every must be >= 0, got " + std::to_string(options.every));
  }
}

TrainCheckpoints::TrainCheckpoints(const CheckpointOptions& options, const RunOptions& run,
                                   const RlOptions& rl, const ModelConfig& model, bool supported,
                                   int in_flight_ranks)
    : options_(options),
      run_(run),
      rl_(rl),
      supported_(supported),
      resume_(find_resume_point(options.resume, run.run_dir)) {
  if (!resuming()) return;
  const CheckpointCounters c = check_checkpoint(resume_.path, model, rl.kl_coef > 0);
  if (c.seed != run_.seed || c.prompts != rl_.prompts || c.group_size != rl_.group_size ||
      c.staleness != rl_.staleness) {
    throw ConfigError("checkpoint '" + resume_.path + "' was written with --seed " +
                      std::to_string(c.seed) + " --prompts " + std::to_string(c.prompts) +
                      " --group-size " + std::to_string(c.group_size) + " --staleness " +
                      std::to_string(c.staleness) + ": resume with the same values");
  }
  int ranks = in_flight_ranks;
  if (ranks == 0) MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rl_.staleness > 0 && c.in_flight_ranks != ranks) {
    throw ConfigError("checkpoint '" + resume_.path +
                      "' holds the StaleSync samples in flight of " +
                      std::to_string(c.in_flight_ranks) + " ranks: resume with the layout it " +
                      "was written with (this run has " + std::to_string(ranks) +
                      " ranks that generate or train)");
  }
  if (c.step >= rl_.steps) {
    throw ConfigError("checkpoint '" + resume_.path + "' is at step " + std::to_string(c.step) +
                      ", not before --steps " + std::to_string(rl_.steps) + ": nothing to resume");
  }
  // Checked here, before any work (ConfigError when inconsistent).
  saved_placement_ = read_checkpoint_placement(resume_.path, model);
}

TrainCheckpoints::~TrainCheckpoints() {
  if (!watching_) return;
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
}

void TrainCheckpoints::describe(RunDirectory& dir) const {
  for (const std::string& reason : resume_.skipped)
    dir.log("# --resume auto skips: %s\n", reason.c_str());
  if (resuming()) {
    dir.log("# resuming from checkpoint %s\n", resume_.path.c_str());
  } else if (options_.resume == "auto") {
    dir.log("# --resume auto: no valid checkpoint in %s/checkpoints, starting from scratch\n",
            run_.run_dir.c_str());
  }
}

std::string TrainCheckpoints::adopt_placement(RoleExpertParallel& ep, int layers) const {
  char line[400];
  if (!saved_placement_) {
    std::snprintf(line, sizeof line,
                  "# the checkpoint holds no expert placement: resuming at the default one\n");
    return line;
  }
  const CheckpointPlacement& saved = *saved_placement_;
  if (!placement_fits(saved, ep.degree(), ep.local_slots())) {
    std::snprintf(
        line, sizeof line,
        "# the checkpoint's expert placement (EP %d, %d slots per rank) does not fit this "
        "run's (EP %d, %d slots per rank): resuming at the default placement, the experts "
        "read by id (not bit-exact with the run that wrote it)\n",
        saved.ep_degree, saved.slots_per_rank, ep.degree(), ep.local_slots());
    return line;
  }
  ep.adopt_slots(saved.slot_experts, layers);
  std::snprintf(line, sizeof line,
                "# resuming at the checkpoint's expert placement (EP %d, %d slots per rank, %d "
                "replicated (layer, expert) pairs)\n",
                saved.ep_degree, saved.slots_per_rank, ep.replicated_experts());
  return line;
}

CheckpointPlacement TrainCheckpoints::placement_of(const RoleExpertParallel& ep) const {
  CheckpointPlacement placement;
  placement.ep_degree = ep.degree();
  placement.slots_per_rank = ep.local_slots();
  placement.slot_experts = ep.slot_experts();
  if (rebalancer_ && rebalancer_->rebalancing()) {
    placement.has_rebalancer = true;
    placement.rebalancer = rebalancer_->state();
  }
  return placement;
}

RlPosition TrainCheckpoints::load(const TrainingState& state, RoleExpertParallel* ep) const {
  const Transformer<float>& model = *state.model;
  std::string note;
  CheckpointTensors tensors = tensors_of(buffers_of(state));
  // (TP x EP too: every TP rank's EP group adopts the same tables; PP x EP too, every stage's EP
  // group the tables of every layer, as its dispatchers follow them.)
  if (ep && model.layout().expert_sharded()) {
    note = adopt_placement(
        *ep, expert_layers(pipeline_ ? ParameterLayout(model.config()) : model.layout()));
    // Every slot this rank stores (spare ones too) from its expert's rows.
    tensors.slot_experts = &ep->slot_experts();
    if (rebalancer_ && saved_placement_ && saved_placement_->has_rebalancer) {
      rebalancer_->restore(saved_placement_->rebalancer);
      note += "# the rebalancer continues from the checkpoint's load predictors and interval\n";
    }
  }
  // With sharded experts only this rank's experts' rows are read (any EP degree), with pipeline
  // stages only the stage's tensors (any PP degree), with TP the rank's slices of them (any TP
  // degree, straight from the file).
  const CheckpointCounters c =
      read_checkpoint(resume_.path, model.config(), model.layout(), tensors);
  if (pool_) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    pool_->restore(read_in_flight(resume_.path, rank));
  }
  state.optimizer->restore_steps_taken(c.optimizer_steps);
  RlPosition p;
  p.step = c.step;
  p.rl_tokens = c.rl_tokens;
  p.rl_seconds = c.rl_seconds;
  p.initial.prompts = c.initial_prompts;
  p.initial.correct = c.initial_correct;
  p.before_rl.prompts = c.before_rl_prompts;
  p.before_rl.correct = c.before_rl_correct;
  p.step_rewards = c.step_rewards;
  p.placement_note = note;
  return p;
}

std::vector<InFlightSample> TrainCheckpoints::saved_in_flight(int rank) const {
  return read_in_flight(resume_.path, rank);
}

void TrainCheckpoints::watch_signals() {
  if (!supported_) return;
  g_stop_signal = 0;
  std::signal(SIGTERM, record_stop_signal);
  std::signal(SIGUSR1, record_stop_signal);
  watching_ = true;
}

bool TrainCheckpoints::stop_agreed(int step, MPI_Comm comm,
                                   const std::function<void(MPI_Request&)>& wait) const {
  if (!supported_) return false;
  int stop = g_stop_signal != 0 ? 1 : 0;
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, comm, &request);
  if (wait) {
    wait(request);
  } else {
    MPI_Wait(&request, MPI_STATUS_IGNORE);
  }
  // After the last step the run simply finishes (its model.h5 is what a checkpoint would hold).
  return stop != 0 && step < rl_.steps;
}

void TrainCheckpoints::save(const RlPosition& position, const TrainingState& state, bool writer,
                            RoleExpertParallel* ep, MPI_Comm comm) const {
  CheckpointCounters c;
  c.step = position.step;
  c.optimizer_steps = state.optimizer->steps_taken();
  c.rl_tokens = position.rl_tokens;
  c.rl_seconds = position.rl_seconds;
  c.initial_prompts = position.initial.prompts;
  c.initial_correct = position.initial.correct;
  c.before_rl_prompts = position.before_rl.prompts;
  c.before_rl_correct = position.before_rl.correct;
  c.step_rewards = position.step_rewards;
  c.seed = run_.seed;
  c.prompts = rl_.prompts;
  c.group_size = rl_.group_size;
  c.staleness = rl_.staleness;
  const Transformer<float>& model = *state.model;
  // With StaleSync every rank's pool goes to world rank 0 (collective: before any rank returns),
  // which writes it into the file (with TP each rank of a TP group saves its own alike pool).
  // Model-parallel fused layouts save samples in flight only with a pool (fused StaleSync);
  // disaggregated TP learners join the actors' gather of their queued batches.
  const bool model_parallel = pipeline_ || tensor_parallel_;
  const bool with_in_flight = in_flight_ && (pool_ || actor_batches_ || !model_parallel);
  std::vector<std::vector<InFlightSample>> in_flight;
  if (with_in_flight) {
    in_flight = gather_in_flight(pool_ ? pool_->saved_samples() : kNothingInFlight, comm);
  }
  if (pipeline_ && ep) {
    // PP x EP: the stages of the first EP replica's pipelines write together, each its layers
    // and experts (with StaleSync, world rank 0 the pools in flight).
    CheckpointTensors stage = tensors_of(buffers_of(state));
    if (writer && with_in_flight) stage.in_flight = &in_flight;
    const CheckpointPlacement placement = placement_of(*ep);
    write_pipeline_expert_checkpoint(run_.run_dir, model.config(), c, stage, *pipeline_, *ep,
                                     placement, comm);
    return;
  }
  // Replica 0's EP group writes the one file together, each rank its own experts by id (parallel
  // HDF5), with the placement (and the rebalancer's state) beside them.
  auto write_expert_rows = [&](CheckpointTensors tensors, const ParameterLayout& layout) {
    // After expert migration a rank's slots hold any experts, with spare slots replicas: the
    // file stores each expert once by id.
    tensors.slot_experts = &ep->slot_experts();
    const CheckpointPlacement placement = placement_of(*ep);
    tensors.placement = &placement;
    write_checkpoint_sharded(run_.run_dir, model.config(), layout, c, tensors, ep->ep_group().comm);
  };
  if (tensor_parallel_ && ep) {
    // TP x EP: the first EP replica's TP groups gather their slices on their TP rank 0 (which
    // then holds the whole dense tensors and its experts), and TP rank 0's EP group, world rank
    // 0's, writes.
    if (ep->replica() != 0) return;
    const ParameterLayout unsliced =
        with_tensor_slice(model.config(), model.layout(), TensorSlice{});
    const bool assembles = tensor_parallel_->rank() == 0;
    std::array<std::vector<float>, kBuffers> whole = gather_whole_buffers(
        state, unsliced,
        [&](const float* part, float* whole_buffer) {
          gather_tensor_parallel_on_rank_zero(part, model.layout(), whole_buffer, unsliced,
                                              model.config(), *tensor_parallel_);
        },
        assembles);
    if (!assembles) return;
    std::array<float*, kBuffers> buffers{};
    for (size_t b = 0; b < kBuffers; ++b) buffers[b] = whole[b].empty() ? nullptr : whole[b].data();
    CheckpointTensors tensors = tensors_of(buffers);
    if (writer && with_in_flight) tensors.in_flight = &in_flight;
    write_expert_rows(tensors, unsliced);
    return;
  }
  if (pipeline_) {
    // The first pipeline's stages write the one file together, each its own layers (parallel
    // HDF5); the other pipelines hold the same values. With TP each stage's slices first come
    // together on its TP rank 0, whose pipeline writes: no rank holds more than its stage.
    if (pipeline_->replica() != 0) return;
    std::array<std::vector<float>, kBuffers> whole_stage;
    std::array<float*, kBuffers> buffers = buffers_of(state);
    const ParameterLayout stage_layout =
        with_tensor_slice(model.config(), model.layout(), TensorSlice{});
    if (tensor_parallel_) {
      whole_stage = gather_whole_buffers(
          state, stage_layout,
          [&](const float* part, float* whole_buffer) {
            gather_tensor_parallel_on_rank_zero(part, model.layout(), whole_buffer, stage_layout,
                                                model.config(), *tensor_parallel_);
          },
          /*assembles=*/tensor_parallel_->rank() == 0);
      if (tensor_parallel_->rank() != 0) return;
      for (size_t b = 0; b < kBuffers; ++b)
        buffers[b] = whole_stage[b].empty() ? nullptr : whole_stage[b].data();
    }
    CheckpointTensors tensors = tensors_of(buffers);
    if (writer && with_in_flight) tensors.in_flight = &in_flight;
    write_checkpoint_sharded(run_.run_dir, model.config(), stage_layout, c, tensors,
                             pipeline_->pipeline().comm);
    return;
  }
  if (model_parallel) {
    // The first TP group gathers the whole model on its TP rank 0, world rank 0, the writer (a
    // gather, not an allgather: the other TP ranks hold only their slices); the other TP groups
    // hold the same values.
    if (tensor_parallel_->replica() != 0) return;
    const ParameterLayout whole_layout(model.config());
    std::array<std::vector<float>, kBuffers> whole = gather_whole_buffers(
        state, whole_layout,
        [&](const float* part, float* whole_buffer) {
          gather_tensor_parallel_on_rank_zero(part, model.layout(), whole_buffer, whole_layout,
                                              model.config(), *tensor_parallel_);
        },
        /*assembles=*/tensor_parallel_->rank() == 0);
    if (tensor_parallel_->rank() != 0) return;
    std::array<float*, kBuffers> buffers{};
    for (size_t b = 0; b < kBuffers; ++b) buffers[b] = whole[b].empty() ? nullptr : whole[b].data();
    CheckpointTensors tensors = tensors_of(buffers);
    if (writer && with_in_flight) tensors.in_flight = &in_flight;
    // (The writer, world rank 0 or learner 0, is TP rank 0 of the first TP group.)
    if (writer) write_checkpoint(run_.run_dir, model.config(), whole_layout, c, tensors);
    return;
  }
  CheckpointTensors tensors = tensors_of(buffers_of(state));
  if (writer && with_in_flight) tensors.in_flight = &in_flight;
  if (!model.layout().expert_sharded()) {
    if (writer) write_checkpoint(run_.run_dir, model.config(), model.layout(), c, tensors);
    return;
  }
  // (World rank 0, which holds the pools, is EP rank 0 of replica 0, the group's rank 0.)
  // The other data-parallel replicas hold the same values.
  if (ep->replica() != 0) return;
  write_expert_rows(tensors, model.layout());
}

bool TrainCheckpoints::end_of_step(int step, const RlPosition& position, double seconds,
                                   const TrainingState& state, bool writer, RoleExpertParallel* ep,
                                   MPI_Comm comm, RunDirectory& dir,
                                   const std::function<void(MPI_Request&)>& wait) const {
  const bool stopping = stop_agreed(step, comm, wait);
  if (due(step, stopping)) {
    RlPosition at = position;
    at.step = step;
    at.rl_seconds += seconds;
    save(at, state, writer, ep, comm);
  }
  if (stopping) dir.log("%s", stop_message(step).c_str());
  return stopping;
}

bool TrainCheckpoints::actor_end_of_step(int step, const std::vector<InFlightSample>& queued,
                                         MPI_Comm comm,
                                         const std::function<void(MPI_Request&)>& wait) const {
  const bool stopping = stop_agreed(step, comm, wait);
  // The trainers' save() gathers over the same communicator: join it with this batch.
  if (due(step, stopping) && in_flight_) gather_in_flight(queued, comm);
  return stopping;
}

std::string TrainCheckpoints::stop_message(int step) const {
  return "# stopped by SIGTERM or SIGUSR1 after RL step " + std::to_string(step) + ": checkpoint " +
         checkpoint_path(run_.run_dir, step) + "; continue with --resume auto (exit code " +
         std::to_string(kExitCheckpointedOnSignal) + ")\n";
}

}  // namespace rlf
