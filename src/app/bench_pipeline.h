// `rlfusion bench pipeline`'s options, shared by its PP (x DP) rows
// (bench_pipeline.cpp) and its PP x EP overlap rows (bench_pipeline_overlap.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "mpi_comm/links.h"
#include "src/model/model_config.h"
#include "src/model/pipeline_stage.h"
#include "src/runtime/pipeline_schedule.h"

namespace rlf {

struct PipelineBenchOptions {
  int pipeline_parallel = 0;  // 0: every rank in one pipeline
  std::string micro_batches = "2,4,8", virtual_stages = "1,2";
  int layers = 8;  // 0: the model's
  int sequences = 2, length = 32, repeats = 3;
  std::string balance = "uniform";
  // > 0: each row's steps again with every pass paced to this times the slowest virtual stage's
  // mean pass (forward and backward apart), so that the stages cost the same (PassFloor).
  double pace = 1.2;
  // PP x EP: EP inside every stage, each row run without and with --ep-overlap-chunks.
  int expert_parallel = 1, overlap_chunks = 2;
  double inter_node_bandwidth = 0;  // with EP: each rank its own node, links emulated
  // The queue part (bench_pipeline_queue.h): TxP layouts, a step's samples, queue shards.
  std::string queue_layouts = "1x1,2x1,1x2,2x2";
  int queue_samples = 256, queue_shards = 2;
};

// ConfigError, the same on every rank, for the PP x EP options: EP not dividing the pipelines or
// the experts, overlap chunks below 2, measured balancing (the EP rows cut the layers evenly), a
// bad bandwidth.
void validate_pipeline_overlap_options(const PipelineBenchOptions& o, const ModelConfig& config,
                                       int world);

// The PP x EP rows: for every v and m, the same step on the same weights and micro-batches
// without and with overlap chunks, their EP communication (in flight, exposed, hidden) and wall
// times per rank, and the overlapped gradients checked against the plain ones. Prints the table
// (and with `json` its twin) on rank 0; returns the elements outside tolerance (every rank).
uint64_t run_pipeline_overlap_rows(const PipelineBenchOptions& o, const ModelConfig& config,
                                   Device& device, const std::vector<int>& virtual_stages,
                                   const std::vector<int>& micro_batches, uint64_t seed, bool json);

}  // namespace rlf
