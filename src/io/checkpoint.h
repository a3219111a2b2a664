// Restartable training checkpoints: one HDF5 file per checkpoint in RUN_DIR/checkpoints/
// (step_NNNNNN.h5) holding the model shape, the parameters, AdamW's moments and step counter,
// the frozen reference policy when a KL term uses one, and the run's counters; a CRC-32C per
// dataset (attribute `crc32c`: one per expert for the routed-expert tensors, so a reader of some
// experts checks what it reads) and one of the whole file in a sidecar (step_NNNNNN.h5.crc32c),
// checked before HDF5 ever opens the file. Written under a temporary name, fsynced and renamed,
// then the sidecar, then the `latest` marker, each atomically: a crash at any point leaves the
// previous checkpoint intact (docs: README "Checkpoints and restart").
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "src/io/checkpoint_placement.h"
#include "src/io/in_flight_sample.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// Everything besides the tensors that a run needs to continue bit for bit. The sampler and the
// task generator are counter-based (keyed by seed, sample id and position), and the learning
// rate is a pure function of the step, so no random-number state exists beyond the seed.
struct CheckpointCounters {
  int step = 0;             // RL steps completed (the policy version is `step`)
  int optimizer_steps = 0;  // AdamW's step counter (bias correction)
  int64_t rl_tokens = 0;    // trained tokens so far (summed over learners)
  double rl_seconds = 0;    // RL wall time so far
  // Held-out evaluations before and after the warm start (the summary reports them).
  int initial_prompts = 0, initial_correct = 0;
  int before_rl_prompts = 0, before_rl_correct = 0;
  std::vector<double> step_rewards;  // mean reward of every step so far
  // What decides the samples: a resumed run must use the same values.
  uint64_t seed = 0;
  int prompts = 0, group_size = 0;
  int staleness = 0;  // StaleSync's bound (0: synchronous, nothing in flight between steps)
  // Read back only: how many ranks' in-flight samples the file holds (0: none).
  int in_flight_ranks = 0;
};

// The training state's buffers, each layout.total() floats; `reference` may be null.
struct CheckpointTensors {
  float* parameters = nullptr;
  float* first_moment = nullptr;
  float* second_moment = nullptr;
  float* reference = nullptr;
  // Writing only: every rank's StaleSync samples in flight (index: rank), or null for none; saved
  // in /in_flight/rank_NNNNN. write_checkpoint_sharded takes them from its rank 0.
  const std::vector<std::vector<InFlightSample>>* in_flight = nullptr;
  // With a sharded layout (write_checkpoint_sharded, read_checkpoint): each layer's slot ->
  // expert table in force, [layer][slot] over the EP group's slots (a rank's layout stores slots
  // [first_expert(), first_expert() + stored_experts())); null: the identity (no migration, no
  // spare slots). The file holds every expert once, by global id, whatever the placement: the
  // writers write each expert's first replica (its lowest slot; replicas are bit-identical), a
  // reader fills every slot it stores (spare slots too) from its expert's rows.
  const std::vector<std::vector<int>>* slot_experts = nullptr;
  // Writing: the expert placement and the rebalancer's state, saved in /placement (with
  // write_checkpoint_sharded every rank passes the same; rank 0's is written), or null.
  const CheckpointPlacement* placement = nullptr;
};

// RUN_DIR/checkpoints/step_NNNNNN.h5
std::string checkpoint_path(const std::string& run_dir, int step);

// Where a checkpoint write spends its time (seconds), for `bench checkpoint`.
struct CheckpointWriteTimes {
  double data = 0;    // HDF5 file written (with the per-dataset CRC-32Cs) and closed
  double fsync = 0;   // the data file fsynced (overlapped with `crc`)
  double crc = 0;     // the whole file's CRC-32C (read back from the page cache)
  double finish = 0;  // rename, sidecar, `latest`, pruning (each fsynced)
};

// Writes the checkpoint of `counters.step` into RUN_DIR/checkpoints, then points `latest` at it
// and deletes checkpoints older than the previous one (two stay: a damaged newest one still
// has a fallback).
// `times`, when given, receives where the write spent its time. `layout` stores every expert.
void write_checkpoint(const std::string& run_dir, const ModelConfig& config,
                      const ParameterLayout& layout, const CheckpointCounters& counters,
                      const CheckpointTensors& tensors, CheckpointWriteTimes* times = nullptr);

// The same checkpoint written collectively by the ranks of `comm`, each rank's `layout` storing
// part of the model: one expert-parallel group's ranks their own experts, a pipeline's stages
// their layers (ParameterLayout with a LayerShard, every expert), or both (the stages of E
// pipelines, each stage's E ranks its experts of its layers). The file is created through MPI-IO;
// every rank writes its experts' rows of each routed-expert dataset it stores (a hyperslab), every
// other tensor is written by the lowest rank storing it, rank 0 the counters, samples in flight
// and placement; the checksums are merged for the attributes. Rank 0's counters are written. Then
// rank 0 fsyncs, checksums and renames as write_checkpoint does. No rank holds another rank's part
// at any point. std::invalid_argument when a tensor is stored by no rank or a non-expert tensor is
// not whole; std::runtime_error on every rank when the write fails.
void write_checkpoint_sharded(const std::string& run_dir, const ModelConfig& config,
                              const ParameterLayout& layout, const CheckpointCounters& counters,
                              const CheckpointTensors& tensors, MPI_Comm comm,
                              CheckpointWriteTimes* times = nullptr);

// ConfigError naming the file unless its sidecar exists and its size and CRC-32C match (checked
// before the file is opened with HDF5).
void verify_checkpoint_file(const std::string& path);

// Verifies the file and checks, without reading any tensor, that it was written for `config`
// (shape) and holds a reference policy exactly when `with_reference`; returns its counters.
// ConfigError naming the file on any mismatch.
CheckpointCounters check_checkpoint(const std::string& path, const ModelConfig& config,
                                    bool with_reference);
// Where a checkpoint read spends its time (seconds), for `bench checkpoint`.
struct CheckpointReadTimes {
  double verify = 0;  // the whole file's CRC-32C against its sidecar, before HDF5 opens it
  double data = 0;    // HDF5 open, attributes and datasets read (with the per-dataset CRC-32Cs)
};

// check_checkpoint, then every dataset into `tensors` (each checked against its CRC-32C). With a
// sharded `layout` only the rows of the experts it stores are read (and checked), so a checkpoint
// loads at any expert-parallel degree; with a tensor slice (tensor parallelism) only the rank's
// slice of each cut tensor is copied (its checksum taken over the whole tensor in the file), so a
// checkpoint loads at any TP degree with no whole-model buffer. `times`, when given, receives
// where the read spent its time.
CheckpointCounters read_checkpoint(const std::string& path, const ModelConfig& config,
                                   const ParameterLayout& layout, const CheckpointTensors& tensors,
                                   CheckpointReadTimes* times = nullptr);

// Rank `rank`'s in-flight samples of a checkpoint that read_checkpoint has verified; ConfigError
// naming the file when it holds none for that rank or they do not match their checksums.
std::vector<InFlightSample> read_in_flight(const std::string& path, int rank);

// The expert placement and rebalancer state of a checkpoint that read_checkpoint has verified, or
// none (written without expert parallelism, or by format 2). ConfigError naming the file when
// they are inconsistent (placement_problem) or do not match their checksums.
std::optional<CheckpointPlacement> read_checkpoint_placement(const std::string& path,
                                                             const ModelConfig& config);

struct ResumePoint {
  std::string path;                  // the checkpoint to load; "" to start from scratch
  std::vector<std::string> skipped;  // why newer checkpoints were passed over (auto only)
};

// --resume: "" (no resume), "auto" (the `latest` marker if it verifies, else the newest
// checkpoint in RUN_DIR/checkpoints that does, else nothing), or a checkpoint file, which must
// verify (ConfigError otherwise).
ResumePoint find_resume_point(const std::string& resume, const std::string& run_dir);

}  // namespace rlf
