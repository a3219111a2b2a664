// The analytic activation peaks (src/model/activation_memory.h) of a tensor-parallel rank against
// its arena's measured peak: generation and a training micro-batch of tiny and small at TP 2 (2, 4
// and 6 ranks) and TP 4 (4 ranks), every rank of a TP group on the same batch, within 5% as on one
// rank (tests/rl/test_activation_peak.cpp). A rank holds only its heads' Q, K, V, attention output
// and KV cache and its slice of the shared expert, so the count of the unsliced layout is far
// above what it measures (checked: more than 5% over in every generation case). Every case again
// with the expert token split (each TP rank computing its share of the rows' routed experts),
// counted at that share on every rank; and TP x EP at 4 ranks, split and duplicated (below).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "mpi_comm/links.h"
#include "src/model/activation_memory.h"
#include "src/model/generation.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "src/rl/policy_loss.h"
#include "src/runtime/role_expert_parallel.h"
#include "tests/activation_peak_util.h"
#include "tests/mpi/mpi_test_util.h"

namespace rlf {
namespace {

const std::vector<test::PeakCase> kCases = {
    {"tiny", 8, 4, 12, 16}, {"tiny", 32, 10, 20, 24}, {"small", 16, 8, 24, 16}};

std::vector<int> degrees_for(int world) {
  std::vector<int> degrees;
  for (int degree : {2, 4})
    if (world % degree == 0) degrees.push_back(degree);
  return degrees;
}

// One case's measured peaks on `device` (generation of its prompts, then a training
// micro-batch of its rollouts) and the batches the analytic counts take.
struct MeasuredPeaks {
  size_t generation = 0, training = 0;
  PackedBatch prompts, trained;
  int max_len = 0;
};

MeasuredPeaks measure_peaks(Transformer<float>& model, Arena& device, const test::PeakCase& c,
                            const ModelConfig& config) {
  MeasuredPeaks m;
  const auto prompts =
      test::prompts_of(c.samples, c.shortest_prompt, c.longest_prompt, config.vocab_size);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(int64_t(i));
  GenerationSettings settings;
  settings.max_new_tokens = c.new_tokens;
  settings.seed = 9;
  m.generation = test::measured_peak(device, [&] { generate(model, prompts, ids, settings); });
  m.prompts = packed_batch(test::lengths_of(prompts));
  m.max_len = c.longest_prompt + c.new_tokens;
  std::vector<std::vector<int>> sequences;
  const std::vector<Rollout> rollouts = test::rollouts_of(c, config.vocab_size, sequences);
  std::vector<const Rollout*> micro;
  for (const Rollout& r : rollouts) micro.push_back(&r);
  m.training = test::measured_peak(
      device, [&] { accumulate_policy_gradient(model, micro, 100.0, 1.0f, PpoSettings{}, 0.01f); });
  m.trained = packed_batch(test::lengths_of(sequences, 1));
  return m;
}

TEST(TensorParallelActivationPeak, GenerationAndTrainingEqualAnalyticWithin5Percent) {
  const std::vector<int> degrees = degrees_for(test::world_size());
  if (degrees.empty()) GTEST_SKIP() << "an even number of ranks";
  Links links(test::virtual_node_list(test::world_size(), 1), LinkEmulation{});
  for (int degree : degrees) {
    for (const bool split : {false, true}) {
      for (const test::PeakCase& c : kCases) {
        const std::string what = c.model + " at TP " + std::to_string(degree) + ", " +
                                 std::to_string(c.samples) + " samples" +
                                 (split ? ", expert token split" : "");
        SCOPED_TRACE(what);
        const ModelConfig config = load_model_config(c.model);
        TensorParallel tp(MPI_COMM_WORLD, degree, false, config, links);
        Arena device("tp device", size_t(1) << 30);
        Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true, ExpertShard{},
                                 LayerShard{}, &tp);
        model.set_expert_token_split(split);
        model.initialize(5);
        const MeasuredPeaks m = measure_peaks(model, device, c, config);
        test::expect_within_5_percent(
            m.generation,
            generation_peak_bytes(config, model.layout(), m.prompts, m.max_len, true, split),
            "generation");
        EXPECT_GT(double(generation_peak_bytes(config, ParameterLayout(config), m.prompts,
                                               m.max_len, true)),
                  1.05 * double(m.generation))
            << "the unsliced count should be above the TP rank's";
        test::expect_within_5_percent(
            m.training, training_micro_batch_peak_bytes(config, model.layout(), m.trained, split),
            "training micro-batch");
      }
    }
  }
}

// TP 2 x EP 2 on 4 ranks, split and duplicated: a rank's routed buffers hold the rows its EP
// group sent it, which the analytic count takes as the balanced share (as many as it
// dispatched). Generation holds one layer at a time, so its peak is the layer that received the
// most, a few percent above the balanced share (measured: up to 6.1% under in generation, within
// 3% in training): within 7%. With the split the count of every rank computing all rows is far
// above the measured peak (15-20%; checked on training, which every case's routed rows reach).
TEST(TensorParallelActivationPeak, TensorExpertParallelWithin7Percent) {
  if (test::world_size() != 4) GTEST_SKIP() << "4 ranks";
  Links links(test::virtual_node_list(test::world_size(), 1), LinkEmulation{});
  for (const bool split : {false, true}) {
    for (const test::PeakCase& c : kCases) {
      const std::string what = c.model + " at TP 2 x EP 2, " + std::to_string(c.samples) +
                               " samples" + (split ? ", expert token split" : "");
      SCOPED_TRACE(what);
      const ModelConfig config = load_model_config(c.model);
      TensorParallel tp(MPI_COMM_WORLD, 2, false, config, links);
      RoleExpertParallel ep(tp.data_parallel(), links, config.n_experts, 2, DispatchMode::Flat);
      Arena device("tp x ep device", size_t(1) << 30);
      Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true, ep.shard(),
                               LayerShard{}, &tp);
      ep.attach(model, 1);
      model.set_expert_token_split(split);
      model.initialize(5);
      const MeasuredPeaks m = measure_peaks(model, device, c, config);
      EXPECT_NEAR(
          double(generation_peak_bytes(config, model.layout(), m.prompts, m.max_len, true, split)) /
              double(m.generation),
          1.0, 0.07)
          << "generation " << m.generation;
      EXPECT_NEAR(
          double(training_micro_batch_peak_bytes(config, model.layout(), m.trained, split)) /
              double(m.training),
          1.0, 0.07)
          << "training " << m.training;
      if (split) {
        EXPECT_GT(double(training_micro_batch_peak_bytes(config, model.layout(), m.trained, false)),
                  1.1 * double(m.training))
            << "the unsplit count should be above the split rank's";
      }
    }
  }
}

}  // namespace
}  // namespace rlf
