// The PP x EP x DP layouts of the MPI tests (train --pipeline-parallel P --expert-parallel E):
// their names and the micro model they run.
#pragma once

#include <string>
#include <vector>

#include "src/balance/stage_balance.h"
#include "src/model/model_config.h"
#include "tests/micro_model_config.h"

namespace rlf::test {

struct PipelineExpertCase {
  int stages, ep, virtual_stages, micro_batches;
  // Layers of each chunk in virtual-stage order (stage balancing); empty: 2 per chunk.
  std::vector<int> layers_per_chunk = {};
};

inline std::string case_name(const PipelineExpertCase& c) {
  std::string name = "PP " + std::to_string(c.stages) + " x EP " + std::to_string(c.ep) +
                     " v=" + std::to_string(c.virtual_stages) +
                     " m=" + std::to_string(c.micro_batches);
  if (!c.layers_per_chunk.empty()) {
    name += " layers per chunk ";
    name += layers_per_chunk(chunk_boundaries(c.layers_per_chunk));
  }
  return name;
}

// The chunk boundaries of an uneven case (empty: PipelineGroups' equal chunks).
inline std::vector<int> case_boundaries(const PipelineExpertCase& c) {
  return c.layers_per_chunk.empty() ? std::vector<int>{} : chunk_boundaries(c.layers_per_chunk);
}

// 6 experts fit EP 1, 2 and 3; 2 p v layers, or the uneven chunks' sum.
inline ModelConfig pipeline_expert_model(const PipelineExpertCase& c) {
  ModelConfig config = micro_config();
  config.n_experts = 6;
  config.n_layers =
      c.layers_per_chunk.empty() ? 2 * c.stages * c.virtual_stages : case_boundaries(c).back();
  config.validate("test");
  return config;
}

}  // namespace rlf::test
