// The analytic activation peaks (src/model/activation_memory.h) of a tensor-parallel rank against
// its arena's measured peak: generation and a training micro-batch of tiny and small at TP 2 (2, 4
// and 6 ranks) and TP 4 (4 ranks), every rank of a TP group on the same batch, within 5% as on one
// rank (tests/rl/test_activation_peak.cpp). A rank holds only its heads' Q, K, V, attention output
// and KV cache and its slice of the shared expert, so the count of the unsliced layout is far
// above what it measures (checked: more than 5% over in every generation case). Every case again
// with the expert token split (each TP rank computing its share of the rows' routed experts),
// counted at that share on every rank.
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

        const auto prompts =
            test::prompts_of(c.samples, c.shortest_prompt, c.longest_prompt, config.vocab_size);
        std::vector<int64_t> ids;
        for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(int64_t(i));
        GenerationSettings settings;
        settings.max_new_tokens = c.new_tokens;
        settings.seed = 9;
        const size_t generation =
            test::measured_peak(device, [&] { generate(model, prompts, ids, settings); });
        const PackedBatch packed = packed_batch(test::lengths_of(prompts));
        const int max_len = c.longest_prompt + c.new_tokens;
        test::expect_within_5_percent(
            generation, generation_peak_bytes(config, model.layout(), packed, max_len, true, split),
            "generation");
        EXPECT_GT(
            double(generation_peak_bytes(config, ParameterLayout(config), packed, max_len, true)),
            1.05 * double(generation))
            << "the unsliced count should be above the TP rank's";

        std::vector<std::vector<int>> sequences;
        const std::vector<Rollout> rollouts = test::rollouts_of(c, config.vocab_size, sequences);
        std::vector<const Rollout*> micro;
        for (const Rollout& r : rollouts) micro.push_back(&r);
        const size_t training = test::measured_peak(device, [&] {
          accumulate_policy_gradient(model, micro, 100.0, 1.0f, PpoSettings{}, 0.01f);
        });
        test::expect_within_5_percent(
            training,
            training_micro_batch_peak_bytes(config, model.layout(),
                                            packed_batch(test::lengths_of(sequences, 1)), split),
            "training micro-batch");
      }
    }
  }
}

}  // namespace
}  // namespace rlf
