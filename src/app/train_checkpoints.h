// Checkpoints and restart for `train` (one rank, disaggregated and fused runs, synchronous or
// StaleSync, experts sharded or not): --checkpoint-every, --resume auto|PATH, and SIGTERM /
// SIGUSR1, which make every rank agree at the next step boundary to write a checkpoint and stop
// with exit code 3. The file format is src/io/checkpoint.h. A checkpoint always holds the whole
// model: with sharded experts, the ranks of replica 0's EP group write it together through parallel
// HDF5, each its own experts' rows, and each learner reads back only the experts it stores, so a
// checkpoint loads at any EP degree and no rank ever holds another rank's experts. With pipeline
// stages the first pipeline gathers the whole model onto world rank 0, which writes it; each stage
// reads back its own layers, so a checkpoint loads at any PP degree, or without pipelines. With
// tensor parallelism the first TP group (with PP too: the first model replica) gathers the TP
// slices into the whole tensors; each rank reads back the whole tensors of its layers and keeps its
// slice, so a checkpoint loads at any TP degree, with or without pipelines. With EP inside the
// pipeline stages (PP x EP) the first EP replica's pipelines each gather their stages and their
// first stages write the file together as one EP group (src/app/pipeline_expert_checkpoint.h);
// each rank reads back its stage's layers and its experts' rows. With EP over the TP groups
// (TP x EP) the first EP replica's TP groups gather their slices and TP rank 0's EP group writes
// the experts' rows together; each rank reads back the whole dense tensors and its experts' rows
// and keeps its slice. With expert parallelism (alone or at TP x EP) the file also holds the
// expert placement in force (slot tables, replicas of hot experts included) and the rebalancer's
// state (src/io/checkpoint_placement.h): a resume with the same EP degree and spare slots adopts
// the placement (at TP x EP on every TP rank's EP group) and continues bit for bit; any other, and
// PP x EP, resumes at its default placement (the log says which).
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "src/app/options.h"
#include "src/app/rl_options.h"
#include "src/io/checkpoint.h"
#include "src/io/run_directory.h"
#include "src/model/optimizer.h"
#include "src/rl/evaluation.h"
#include "src/rl/rollout_pool.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf {

class PipelineGroups;
class TensorParallel;
class TrainRebalancer;

// `train` wrote a checkpoint after SIGTERM or SIGUSR1 and stopped: continue with --resume auto.
inline constexpr int kExitCheckpointedOnSignal = 3;

struct CheckpointOptions {
  int every = 0;       // steps between checkpoints (0: only on a signal)
  std::string resume;  // "", "auto" or a checkpoint file
};

po::options_description checkpoint_options_description(CheckpointOptions& options);
// ConfigError for bad values.
void validate_checkpoint_options(const CheckpointOptions& options);

// The training state of a rank that trains; `reference` may be null.
struct TrainingState {
  Transformer<float>* model = nullptr;
  AdamW<float>* optimizer = nullptr;
  Transformer<float>* reference = nullptr;
};

// Where RL stands; saved in and restored from a checkpoint.
struct RlPosition {
  int step = 0;  // steps done
  int64_t rl_tokens = 0;
  double rl_seconds = 0;  // before this process started its RL loop
  Evaluation initial, before_rl;
  std::vector<double> step_rewards;
  // load() with expert parallelism: a log line saying which expert placement the run resumes
  // at ("" otherwise).
  std::string placement_note;
};

class TrainCheckpoints {
 public:
  // Finds the checkpoint to resume from and checks, on every rank before any work, that it fits
  // the run (model shape, KL reference, seed, prompts, group size, steps); ConfigError
  // otherwise. Unless `supported` (the same on every rank: validate_checkpoint_options has already
  // rejected options asking for checkpoints) signals keep their default action and nothing is
  // ever saved.
  // With StaleSync the checkpoint holds the samples in flight of `in_flight_ranks` ranks (0: the
  // world): a resume needs the same count.
  TrainCheckpoints(const CheckpointOptions& options, const RunOptions& run, const RlOptions& rl,
                   const ModelConfig& model, bool supported, int in_flight_ranks = 0);
  ~TrainCheckpoints();
  TrainCheckpoints(const TrainCheckpoints&) = delete;
  TrainCheckpoints& operator=(const TrainCheckpoints&) = delete;

  bool resuming() const { return !resume_.path.empty(); }
  // StaleSync (fused): every rank's rollout pool is saved with each checkpoint (gathered on the
  // writer) and refilled by load(). Call before load() on every rank.
  void attach_pool(RolloutPool* pool) {
    pool_ = pool;
    in_flight_ = true;
  }
  // Pipeline parallelism: the training state holds this rank's stage. A checkpoint still holds
  // the whole model: the first pipeline gathers every buffer from its stages and world rank 0
  // writes it; load() reads only the stage's tensors. Call before the first step on every rank.
  void attach_pipeline(const PipelineGroups* groups) { pipeline_ = groups; }
  // Tensor parallelism (`tp`: the TP groups, null for none): the training state holds this rank's
  // slice. Without pipelines the first TP group gathers every buffer's slices and world rank 0
  // writes the whole model (with pipelines attach_pipeline's gather assembles the slices too);
  // load() keeps the rank's slice of what it reads. Call before the first step on every rank.
  void attach_tensor_parallel(const TensorParallel* tp) { tensor_parallel_ = tp; }
  // Expert-parallel learners that rebalance: checkpoints save `rebalancer`'s state (the same on
  // every learner) and load() restores it. Call before load() on every learner.
  void attach_rebalancer(TrainRebalancer* rebalancer) { rebalancer_ = rebalancer; }
  // StaleSync (disaggregated): the actors' last batch, put into DistQueue and not yet taken, is
  // saved with each checkpoint (actor_end_of_step hands it over); trainers add nothing to it.
  void collect_in_flight() {
    in_flight_ = true;
    actor_batches_ = true;
  }
  // Rank `rank` of the gather (actors: their compute-rank index)'s saved samples.
  std::vector<InFlightSample> saved_in_flight(int rank) const;
  // Logs which checkpoint the run continues from and the ones --resume auto passed over.
  void describe(RunDirectory& dir) const;
  // Reads the checkpoint into a trainer's state (the experts its model stores). With `ep` (no
  // pipelines, no TP) the saved placement is put in force first when it fits the EP group
  // (RoleExpertParallel::adopt_slots) and every slot, spare ones included, is read from its
  // expert's rows.
  RlPosition load(const TrainingState& state, RoleExpertParallel* ep = nullptr) const;

  // From here on SIGTERM and SIGUSR1 only set a flag (until destroyed).
  void watch_signals();
  // At the end of `step`, collective over `comm` when supported: whether any rank got a signal
  // (never after the last step). `wait` completes the request (a rank that hosts queue shards
  // serves them meanwhile). Ranks that do not train (actors) call only this.
  bool stop_agreed(int step, MPI_Comm comm,
                   const std::function<void(MPI_Request&)>& wait = {}) const;
  // The end of `step` on a rank that trains (collective over `comm`, and with sharded experts
  // over replica 0's EP group): stop_agreed, then, when a checkpoint is due, `writer`
  // (learner 0) saves `position` (this step counted) with `seconds` of RL in this process added.
  // Returns whether to stop (and logs it).
  bool end_of_step(int step, const RlPosition& position, double seconds, const TrainingState& state,
                   bool writer, RoleExpertParallel* ep, MPI_Comm comm, RunDirectory& dir,
                   const std::function<void(MPI_Request&)>& wait = {}) const;
  // The same boundary on an actor of a disaggregated StaleSync run, which by then has put the
  // next batch: stop_agreed, then, when the trainers write a checkpoint, `queued` (that batch's
  // samples) goes to the writer with it. Returns whether to stop.
  bool actor_end_of_step(int step, const std::vector<InFlightSample>& queued, MPI_Comm comm,
                         const std::function<void(MPI_Request&)>& wait = {}) const;

 private:
  bool due(int step, bool stopping) const {
    // (none after the last step: the run's model.h5 follows)
    return supported_ && step < rl_.steps &&
           (stopping || (options_.every > 0 && step % options_.every == 0));
  }
  // With sharded experts: collective over replica 0's EP group (write_checkpoint_sharded); with
  // pipeline stages or TP, over the first model replica.
  void save(const RlPosition& position, const TrainingState& state, bool writer,
            RoleExpertParallel* ep, MPI_Comm comm) const;
  std::string stop_message(int step) const;
  // load() with expert parallelism: puts the saved placement in force when it fits `ep`; returns
  // the log line saying which placement the run resumes at.
  std::string adopt_placement(RoleExpertParallel& ep, int layers) const;
  // The placement a checkpoint stores beside the experts: `ep`'s slot tables, and the
  // rebalancer's state when it rebalances.
  CheckpointPlacement placement_of(const RoleExpertParallel& ep) const;

  CheckpointOptions options_;
  const RunOptions& run_;
  const RlOptions& rl_;
  bool supported_;
  ResumePoint resume_;
  bool watching_ = false;
  RolloutPool* pool_ = nullptr;
  const PipelineGroups* pipeline_ = nullptr;
  const TensorParallel* tensor_parallel_ = nullptr;
  bool in_flight_ = false;      // checkpoints gather every rank's samples in flight
  bool actor_batches_ = false;  // ... the disaggregated actors' queued batches (StaleSync)
  TrainRebalancer* rebalancer_ = nullptr;
  std::optional<CheckpointPlacement> saved_placement_;  // the resumed checkpoint's, if any
};

}  // namespace rlf
