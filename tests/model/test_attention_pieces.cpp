// Attention in pieces of whole sequences (src/model/attention_pieces.h): the pieces cover the
// batch's sequences in order, a fixed number each; a layer's forward and backward offer a progress
// point after each piece (so that a paired pass's exchange moves during a long attention).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/arena.h"
#include "src/model/attention_pieces.h"
#include "src/model/resumable_pass.h"
#include "src/model/transformer.h"
#include "tests/micro_model_config.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

TEST(AttentionPieces, ConsecutiveSequencesAFixedNumberAPiece) {
  EXPECT_TRUE(attention_pieces(0).empty());
  for (int per_piece = 1; per_piece <= 5; ++per_piece) {
    for (int S = 1; S <= 23; ++S) {
      const std::vector<SequenceRange> pieces = attention_pieces(S, per_piece);
      ASSERT_EQ(int(pieces.size()), (S + per_piece - 1) / per_piece);
      int next = 0;
      for (size_t p = 0; p < pieces.size(); ++p) {
        EXPECT_EQ(pieces[p].first, next);
        EXPECT_EQ(pieces[p].count, p + 1 < pieces.size() ? per_piece : S - next);
        EXPECT_GT(pieces[p].count, 0);
        next += pieces[p].count;
      }
      EXPECT_EQ(next, S);
    }
  }
}

// Progress points a resumable pass offers, counted by its driver.
int progress_points(ResumablePass pass) {
  int points = 0;
  PassState state;
  state.between_pieces = [&points] { ++points; };
  pass.start(state);
  EXPECT_TRUE(pass.done()) << "a pass without expert parallelism stopped";
  return points;
}

// One layer of the micro model over 1, 4, 5 and 9 sequences of 20 tokens (1, 1, 2 and 3 pieces).
// Per layer the forward offers a point before the attention and after each piece, the backward one
// after the MoE block, one before the attention and one after each piece.
TEST(AttentionPieces, ALayerOffersAProgressPointAfterEachPiece) {
  ModelConfig config = test::micro_config();
  config.max_seq_len = 64;
  Arena device("attention pieces", 64 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/true);
  model.initialize(7);
  for (const int sequences : {1, 4, 5, 9}) {
    SCOPED_TRACE(std::to_string(sequences) + " sequence(s)");
    std::vector<int> offsets(1, 0), tokens;
    for (int s = 0; s < sequences; ++s) offsets.push_back(offsets.back() + 20);
    for (int t = 0; t < offsets.back(); ++t) tokens.push_back(t % config.vocab_size);
    const int pieces = int(attention_pieces(sequences).size());
    ASSERT_EQ(pieces, (sequences + kAttentionPieceSequences - 1) / kAttentionPieceSequences);
    const float* hidden = nullptr;
    EXPECT_EQ(progress_points(model.forward_range_pass(tokens.data(), offsets.data(), sequences,
                                                       nullptr, 0, 1, &hidden)),
              1 + pieces);
    ASSERT_NE(hidden, nullptr);
    const std::vector<float> dy =
        test::random_vector<float>(size_t(offsets.back()) * size_t(config.d_model), 11);
    EXPECT_EQ(progress_points(model.backward_range_pass(dy.data(), 1.0f, nullptr)), 2 + pieces);
  }
}

}  // namespace
}  // namespace rlf
