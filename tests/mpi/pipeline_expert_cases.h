// The PP x EP x DP layouts of the MPI tests (train --pipeline-parallel P --expert-parallel E):
// their names and the micro model they run.
#pragma once

#include <string>

#include "src/model/model_config.h"
#include "tests/micro_model_config.h"

namespace rlf::test {

struct PipelineExpertCase {
  int stages, ep, virtual_stages, micro_batches;
};

inline std::string case_name(const PipelineExpertCase& c) {
  return "PP " + std::to_string(c.stages) + " x EP " + std::to_string(c.ep) +
         " v=" + std::to_string(c.virtual_stages) + " m=" + std::to_string(c.micro_batches);
}

// 6 experts fit EP 1, 2 and 3; 2 p v layers.
inline ModelConfig pipeline_expert_model(const PipelineExpertCase& c) {
  ModelConfig config = micro_config();
  config.n_experts = 6;
  config.n_layers = 2 * c.stages * c.virtual_stages;
  config.validate("test");
  return config;
}

}  // namespace rlf::test
