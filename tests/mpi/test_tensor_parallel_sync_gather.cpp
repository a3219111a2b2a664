// gather_tensor_parallel_on_rank_zero (src/model/tensor_parallel.h), the piece the disaggregated
// weight sync uses to assemble the whole model from TP learners' slices: at every TP degree that
// fits the world (1, 2, 4, 6 ranks; TP 1, 2 and 3, on attention and the shared expert or on
// attention only), TP rank 0 of every group gets exactly the single-rank model its group's slices
// come from (each group seeded differently), the bytes it reports are the cut tensors' elements
// it lacked, and every other rank sends its slice once (counted on the links) and gets nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "src/model/tensor_parallel.h"
#include "src/model/transformer.h"
#include "tests/micro_model_config.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

TEST(TensorParallelSyncGather, RankZeroGetsTheSingleRankModel) {
  const int P = test::world_size();
  const ModelConfig config = test::tensor_parallel_micro_config(2);
  int index = 0;
  for (int degree : {1, 2, 3}) {
    if (P % degree != 0) continue;
    for (bool attention_only : {false, true}) {
      SCOPED_TRACE("TP " + std::to_string(degree) + " on " + std::to_string(P) + " ranks" +
                   (attention_only ? ", attention only" : ""));
      Links links(test::virtual_node_list(P, P), {});
      TensorParallel tp(MPI_COMM_WORLD, degree, attention_only, config, links);
      const uint64_t seed =
          test::seed_for("TensorParallelSyncGather", index++) + uint64_t(tp.replica()) * 101;
      Arena device("slice", 32 << 20), whole_device("whole", 32 << 20);
      Transformer<float> slice(config, cpu_ops(), device, false, {}, {}, &tp);
      Transformer<float> single(config, cpu_ops(), whole_device, false);
      slice.initialize(seed);
      single.initialize(seed);
      const ParameterLayout whole_layout(config);
      std::vector<float> gathered(tp.rank() == 0 ? size_t(whole_layout.total()) : 0, -1.0f);
      const uint64_t received = gather_tensor_parallel_on_rank_zero(
          slice.parameters(), slice.layout(), tp.rank() == 0 ? gathered.data() : nullptr,
          whole_layout, config, tp);
      const LinkCounters& sent = links.counters();
      const uint64_t sent_bytes = sent.bytes[0] + sent.bytes[1];
      // The other T - 1 ranks' parts of every cut tensor (the parts are equal).
      uint64_t missing = 0;
      for (const ParameterTensor& t : slice.layout().tensors()) {
        if (t.tp_split != ParameterTensor::TensorSplit::None) {
          missing += uint64_t(t.numel) * uint64_t(degree - 1) * sizeof(float);
        }
      }
      if (tp.rank() == 0) {
        // The slices are exact slices of the seeded model: the assembly is bit for bit.
        // (Tensor by tensor: the layout's alignment gaps belong to no tensor.)
        for (const ParameterTensor& t : whole_layout.tensors()) {
          EXPECT_EQ(0, std::memcmp(gathered.data() + t.offset, single.parameters() + t.offset,
                                   size_t(t.numel) * sizeof(float)))
              << t.name;
        }
        EXPECT_EQ(received, missing);
        EXPECT_EQ(sent_bytes, 0u);
      } else {
        EXPECT_EQ(received, 0u);
        // Its cut tensors, once: 1/(T - 1) of what rank 0 lacked.
        EXPECT_EQ(sent_bytes * uint64_t(degree - 1), missing);
      }
      if (degree > 1) {
        EXPECT_GT(missing, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace rlf
