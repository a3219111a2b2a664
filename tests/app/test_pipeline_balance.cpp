// Stage balancing's pieces inside `train` (src/app/pipeline_balance.h, stage_layer_costs.h,
// integer_list.h): the counted FLOPs of a layer and the head by hand, the --pipeline-balance word
// and list checks, and the boundaries each mode gives (measured runs in the app tests).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/app/integer_list.h"
#include "src/app/pipeline_balance.h"
#include "src/app/stage_layer_costs.h"
#include "tests/micro_model_config.h"

namespace rlf {
namespace {

// The micro model (d_model 8, 4 experts top-2 of width 8, a shared expert of 4) with `layers`
// layers and a vocabulary of `vocab` words.
ModelConfig micro_model(int layers, int vocab) {
  ModelConfig c = test::micro_config();
  c.n_layers = layers;
  c.vocab_size = vocab;
  return c;
}

TEST(PipelineBalance, CountedCostsCountEveryMatmulOfTheForwardAndBackward) {
  // 2 sequences of 9 tokens (mean causal context 5). Per token and forward: Q, K, V, O 4 x 8 x 8,
  // the router 8 x 4, two routed experts 2 x 3 x 8 x 8, the shared expert 3 x 8 x 4 (two FLOPs per
  // multiply-add), attention 4 x 8 x 5; the backward twice the forward.
  const LayerCosts costs = counted_layer_costs(micro_model(3, 11), 2, 9);
  const double layer = 3.0 * 18 * (2 * (256 + 32 + 384 + 96) + 4 * 8 * 5);
  ASSERT_EQ(costs.layer.size(), 3u);
  for (double c : costs.layer) EXPECT_DOUBLE_EQ(c, layer);
  EXPECT_DOUBLE_EQ(costs.last_extra, 3.0 * 18 * 2 * 8 * 11);
  EXPECT_DOUBLE_EQ(costs.first_extra, 0.0);
}

TEST(PipelineBalance, IntegerListsAreCommaSeparatedIntegersInRange) {
  EXPECT_EQ(parse_integer_list("3,1", 0, 10), (std::vector<int>{3, 1}));
  EXPECT_EQ(parse_integer_list("0,2", 0, 10), (std::vector<int>{0, 2}));
  for (const char* bad : {"", "3,", ",3", "3,,1", "x", "3,a", "1.5", "-1", "11"}) {
    EXPECT_TRUE(parse_integer_list(bad, 0, 10).empty()) << bad;
  }
}

std::string config_error(const std::string& balance, int chunks) {
  try {
    validate_pipeline_balance(balance, chunks);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineBalance, ModesAndListsOfOneCountPerChunkPass) {
  for (const char* ok : {"uniform", "counted", "measured", "3,1"}) {
    EXPECT_EQ(config_error(ok, 2), "") << ok;
  }
  EXPECT_EQ(config_error("1,1,1,5", 4), "");
  EXPECT_NE(config_error("fast", 2).find("expected uniform, counted, measured or the layers"),
            std::string::npos);
  EXPECT_NE(config_error("3,1,1", 2)
                .find("needs one layer count per model chunk "
                      "(--pipeline-parallel x --virtual-stages = 2), got 3"),
            std::string::npos);
  EXPECT_NE(config_error("4,0", 2).find("every model chunk needs at least one layer"),
            std::string::npos);
}

TEST(PipelineBalance, BoundariesOfEachMode) {
  const PipelineShape shape{2, 2, 1};
  const StageCostProbe probe;  // 1 sequence of 2 tokens
  const ModelConfig four = micro_model(4, 11);
  EXPECT_TRUE(pipeline_balance_boundaries("uniform", shape, four, probe, MPI_COMM_WORLD).empty());
  EXPECT_EQ(pipeline_balance_boundaries("3,1", shape, four, probe, MPI_COMM_WORLD),
            (std::vector<int>{0, 3, 4}));
  // An 11-word head weighs far less than a layer: equal halves.
  EXPECT_EQ(pipeline_balance_boundaries("counted", shape, four, probe, MPI_COMM_WORLD),
            (std::vector<int>{0, 2, 4}));
  // A 1024-word head weighs more than 8 layers (2 x 8 x 1024 FLOPs per token against 1536 + 4 x 8
  // x 1.5 per layer): the head's stage keeps one layer.
  const ModelConfig heavy_head = micro_model(8, 1024);
  EXPECT_EQ(pipeline_balance_boundaries("counted", shape, heavy_head, probe, MPI_COMM_WORLD),
            (std::vector<int>{0, 7, 8}));
  EXPECT_THROW(
      pipeline_balance_boundaries("counted", PipelineShape{2, 2, 3}, four, probe, MPI_COMM_WORLD),
      ConfigError);
}

}  // namespace
}  // namespace rlf
