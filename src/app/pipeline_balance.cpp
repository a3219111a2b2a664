#include "src/app/pipeline_balance.h"

#include <algorithm>

#include "kernels/device.h"
#include "kernels/error.h"
#include "src/app/integer_list.h"
#include "src/app/pipeline_parallel_train.h"
#include "src/app/stage_layer_costs.h"
#include "src/balance/stage_balance.h"
#include "src/rl/task.h"

namespace rlf {

namespace {

bool is_layer_list(const std::string& balance) {
  return balance != "uniform" && balance != "counted" && balance != "measured";
}

}  // namespace

StageCostProbe stage_cost_probe(const RunOptions& run, const PolicyOptions& policy,
                                int micro_batch) {
  const std::unique_ptr<Task> task = make_task(load_task_config(policy.task, run.seed));
  StageCostProbe probe;
  probe.backend = run.backend_kind();
  probe.device_memory_bytes = run.device_memory_bytes();
  probe.threads = resolve_threads(run.threads);
  probe.seed = run.seed;
  probe.sequences = micro_batch;
  // The longest sample the run trains (as PipelineTrainer sizes its arenas).
  probe.length = 2 + task->max_prompt_chars() + task->max_response_chars();
  return probe;
}

void validate_pipeline_balance(const std::string& balance, int chunks) {
  if (!is_layer_list(balance)) return;
  const std::string given = "--pipeline-balance '" + balance + "'";
  const std::vector<int> counts = parse_integer_list(balance, 0, 1 << 20);
  if (counts.empty()) {
    throw ConfigError(given +
                      ": expected uniform, counted, measured or the layers of each model chunk "
                      "as comma-separated integers >= 1 (e.g. 3,1)");
  }
  if (int(counts.size()) != chunks) {
    throw ConfigError(given +
                      ": needs one layer count per model chunk (--pipeline-parallel x "
                      "--virtual-stages = " +
                      std::to_string(chunks) + "), got " + std::to_string(counts.size()));
  }
  if (std::find(counts.begin(), counts.end(), 0) != counts.end()) {
    throw ConfigError(given + ": every model chunk needs at least one layer");
  }
}

std::vector<int> pipeline_balance_boundaries(const std::string& balance, const PipelineShape& shape,
                                             const ModelConfig& config, const StageCostProbe& probe,
                                             MPI_Comm comm) {
  validate_pipeline_balance(balance, shape.chunks());
  if (balance == "uniform") return {};
  if (is_layer_list(balance)) return chunk_boundaries(parse_integer_list(balance, 0, 1 << 20));
  if (shape.chunks() > config.n_layers) {
    throw ConfigError(
        "--pipeline-balance " + balance + ": --pipeline-parallel " + std::to_string(shape.stages) +
        " x --virtual-stages " + std::to_string(shape.virtual_stages) + " = " +
        std::to_string(shape.chunks()) + " model chunks must not exceed the model's " +
        std::to_string(config.n_layers) + " layers");
  }
  if (balance == "counted") {
    return balance_boundaries(counted_layer_costs(config, probe.sequences, probe.length),
                              shape.chunks());
  }
  // Measured: a device of its own, freed before the run makes its policy's.
  Device device(probe.backend, probe.device_memory_bytes, probe.threads);
  return balance_boundaries(
      agreed_layer_costs(balance, config, device, probe.sequences, probe.length, probe.seed, comm),
      shape.chunks());
}

LayerCosts agreed_layer_costs(const std::string& balance, const ModelConfig& config, Device& device,
                              int sequences, int length, uint64_t seed, MPI_Comm comm) {
  if (balance == "counted") return counted_layer_costs(config, sequences, length);
  const auto batch = random_micro_batches(1, sequences, length, config.vocab_size, seed + 7);
  LayerCosts costs = measure_layer_costs(config, device, batch[0], seed,
                                         stage_activation_bytes(config, sequences, length));
  // The same costs on every rank, so the same boundaries: each layer's slowest time.
  MPI_Allreduce(MPI_IN_PLACE, costs.layer.data(), int(costs.layer.size()), MPI_DOUBLE, MPI_MAX,
                comm);
  return costs;
}

}  // namespace rlf
