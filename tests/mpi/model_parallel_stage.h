// A rank's stage of a TP x PP x EP layout of the world (T x P x E ranks, `virtual_stages` chunks
// per rank), as the pipelined-generation tests build it: its TP group, its pipeline groups, its EP
// group's dispatchers attached, and the stage model storing its chunks' layers, its TP slices and
// its experts (the MoE token split on with TP). Initialized by seed, a stage holds exactly its
// slice of the whole model's weights of that seed.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "src/model/pipeline_stage.h"
#include "src/model/tensor_parallel.h"
#include "src/runtime/pipeline_groups.h"
#include "src/runtime/role_expert_parallel.h"

namespace rlf::test {

struct ModelParallelStage {
  ModelParallelStage(const ModelConfig& config, int T, int P, int E, int virtual_stages,
                     Links& links, Arena& device)
      : tp(T > 1 ? std::make_unique<TensorParallel>(MPI_COMM_WORLD, T, /*attention_only=*/false,
                                                    config, links)
                 : nullptr),
        groups(MPI_COMM_WORLD, {P, P, virtual_stages}, config, links, tp.get(), E),
        ep(E > 1 ? std::make_unique<RoleExpertParallel>(groups.data_parallel(), links,
                                                        config.n_experts, E, DispatchMode::Flat)
                 : nullptr),
        chunks(groups.chunks(groups.stage())),
        model(config, cpu_ops(), device, /*with_gradients=*/false, groups.expert_shard(),
              stage_layer_shard(chunks, config.n_layers), tp.get()) {
    model.set_expert_token_split(T > 1);
    if (ep) ep->attach(model);
  }

  std::unique_ptr<TensorParallel> tp;
  PipelineGroups groups;
  std::unique_ptr<RoleExpertParallel> ep;
  std::vector<LayerRange> chunks;
  Transformer<float> model;
};

}  // namespace rlf::test
