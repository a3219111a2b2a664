// An expert-parallel layer's passes run their routed expert FFN in pieces of whole experts
// (src/model/expert_pieces.h) with a progress point after each, so that a paired pass's exchange
// moves during a long expert FFN: counted by a driver, per rank (whose pieces follow the rows the
// exchange brought it). Bits: the EP model's and pairing's MPI tests compare the passes with the
// single-rank model and the unpaired step; the pieces' own bits,
// tests/model/test_expert_pieces.cpp.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "mpi_comm/expert_dispatch.h"
#include "mpi_comm/split_phase.h"
#include "mpi_comm/topology.h"
#include "src/model/attention_pieces.h"
#include "src/model/expert_pieces.h"
#include "src/model/resumable_pass.h"
#include "src/model/transformer.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

// Runs `pass` to its end, waiting out every exchange; returns the progress points it offered.
int progress_points(ResumablePass pass) {
  int points = 0;
  PassState state;
  state.between_pieces = [&points] { ++points; };
  pass.start(state);
  while (!pass.done()) {
    progress_until_finished(pass.waiting_on(), pass.chains_to_progress());
    pass.resume();
  }
  return points;
}

TEST(ExpertPiecesEp, ALayerOffersAProgressPointAfterEachPieceOfItsExperts) {
  const int P = test::world_size(), rank = test::world_rank();
  // The micro model with one layer and 12 experts (12 divides 1, 2, 4 and 6 ranks).
  ModelConfig config = test::micro_config();
  config.n_layers = 1;
  config.n_experts = 12;
  config.validate("test");
  Links links(test::virtual_node_list(P, 1), {});
  HierarchicalComm ep = make_hierarchical(MPI_COMM_WORLD, links);
  ExpertDispatcher dispatcher(ep, links, config.n_experts, DispatchMode::Flat);
  Arena device("expert pieces", 32 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true);
  model.initialize(5);
  model.set_expert_parallel({&dispatcher});
  // 5 sequences of 12 tokens per rank (2 attention pieces).
  const int S = 5;
  std::vector<int> offsets(1, 0), tokens;
  for (int s = 0; s < S; ++s) offsets.push_back(offsets.back() + 12);
  for (int t = 0; t < offsets.back(); ++t)
    tokens.push_back((t * 5 + 3 * rank + 1) % config.vocab_size);
  const int attention = int(attention_pieces(S).size());

  const float* hidden = nullptr;
  const int forward = progress_points(
      model.forward_range_pass(tokens.data(), offsets.data(), S, nullptr, 0, 1, &hidden));
  ASSERT_NE(hidden, nullptr);
  const std::vector<int>& rows = dispatcher.local_expert_offsets();
  const int experts = int(expert_pieces(rows.data(), dispatcher.local_experts()).size());
  // A point before the attention, one after each attention piece, one after each expert piece.
  EXPECT_EQ(forward, 1 + attention + experts);
  const std::vector<float> dy =
      test::random_vector<float>(size_t(offsets.back()) * size_t(config.d_model), 3);
  // After the MoE block's experts: their pieces, then one after the block, one before the
  // attention, one after each attention piece.
  EXPECT_EQ(progress_points(model.backward_range_pass(dy.data(), 1.0f, nullptr)),
            experts + 2 + attention);
  // Some rank cut its experts (a rank holding one expert, or every row on one, cannot).
  int most = experts;
  MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_GT(most, 1) << "no rank ran its experts in more than one piece";
}

}  // namespace
}  // namespace rlf
