// Tensor-parallel layouts without MPI: each TP rank's seeded initialization is exactly its slice
// of the unsharded initialization (heads of wq/wk/wv by rows, of wo by columns; the shared
// expert's hidden units of w1/w3 by rows, of w2 by columns; the rest whole), the slices of all
// ranks put back together give the whole model, and the validation names what does not divide.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/error.h"
#include "src/model/tensor_parallel.h"
#include "tests/tiny_policy.h"

namespace rlf {
namespace {

using Split = ParameterTensor::TensorSplit;

ModelConfig tp_config() {
  ModelConfig c = test::tiny_policy_config();
  c.d_model = 32;
  c.n_heads = 4;
  c.shared_expert_d_ff = 16;
  c.validate("test");
  return c;
}

TEST(TensorParallelLayout, SliceInitializationIsTheSliceOfTheWholeModel) {
  const ModelConfig config = tp_config();
  const ParameterLayout whole(config);
  std::vector<float> whole_params(size_t(whole.total()));
  initialize_parameters(whole_params.data(), whole, config, 42);
  for (bool attention_only : {false, true}) {
    for (int degree : {1, 2, 4}) {
      for (int rank = 0; rank < degree; ++rank) {
        SCOPED_TRACE("degree " + std::to_string(degree) + " rank " + std::to_string(rank) +
                     (attention_only ? " attention only" : ""));
        const ParameterLayout part(config, {}, {}, {rank, degree, attention_only});
        ASSERT_EQ(part.tensors().size(), whole.tensors().size());
        EXPECT_EQ(part.local_heads(), config.n_heads / degree);
        EXPECT_EQ(part.attention_width(), config.d_model / degree);
        EXPECT_EQ(part.shared_width(),
                  attention_only ? config.shared_expert_d_ff : config.shared_expert_d_ff / degree);
        std::vector<float> got(size_t(part.total()));
        initialize_parameters(got.data(), part, config, 42);
        // Element by element against the unsharded tensor's (row, column).
        for (size_t k = 0; k < part.tensors().size(); ++k) {
          const ParameterTensor& t = part.tensors()[k];
          const ParameterTensor& w = whole.tensors()[k];
          ASSERT_EQ(t.name, w.name);
          const bool attention = t.name.find(".attn.") != std::string::npos;
          const bool shared = t.name.find(".shared.") != std::string::npos;
          const bool cut = degree > 1 && (attention || (shared && !attention_only));
          if (!cut) {
            EXPECT_EQ(t.tp_split, Split::None) << t.name;
            ASSERT_EQ(t.numel, w.numel) << t.name;
            EXPECT_EQ(0, std::memcmp(got.data() + t.offset, whole_params.data() + w.offset,
                                     size_t(t.numel) * sizeof(float)))
                << t.name;
            continue;
          }
          const bool columns = t.name.ends_with("attn.wo") || t.name.ends_with("shared.w2");
          EXPECT_EQ(t.tp_split, columns ? Split::Columns : Split::Rows) << t.name;
          const int64_t rows = w.shape[0], cols = w.shape[1];
          const int64_t my_rows = columns ? rows : rows / degree;
          const int64_t my_cols = columns ? cols / degree : cols;
          ASSERT_EQ(t.shape, (std::vector<int64_t>{my_rows, my_cols})) << t.name;
          for (int64_t r = 0; r < my_rows; ++r) {
            for (int64_t c = 0; c < my_cols; ++c) {
              const int64_t wr = columns ? r : rank * my_rows + r;
              const int64_t wc = columns ? rank * my_cols + c : c;
              ASSERT_EQ(got[size_t(t.offset + r * my_cols + c)],
                        whole_params[size_t(w.offset + wr * cols + wc)])
                  << t.name << " (" << r << ", " << c << ")";
            }
          }
        }
        // slice_parameters gives the same slice from the whole buffer.
        std::vector<float> sliced(size_t(part.total()), 0.0f);
        slice_parameters(whole_params.data(), whole, sliced.data(), part);
        EXPECT_EQ(0, std::memcmp(sliced.data(), got.data(), got.size() * sizeof(float)));
      }
    }
  }
}

TEST(TensorParallelLayout, SlicesPutBackTogetherGiveTheWholeModel) {
  const ModelConfig config = tp_config();
  const ParameterLayout whole(config);
  std::vector<float> original(size_t(whole.total()));
  initialize_parameters(original.data(), whole, config, 7);
  for (bool attention_only : {false, true}) {
    const int degree = 4;
    std::vector<float> rebuilt(size_t(whole.total()), 0.0f);
    std::vector<int> written(size_t(whole.total()), 0);
    for (int rank = 0; rank < degree; ++rank) {
      const ParameterLayout part(config, {}, {}, {rank, degree, attention_only});
      std::vector<float> piece(size_t(part.total()));
      initialize_parameters(piece.data(), part, config, 7);
      for (size_t k = 0; k < part.tensors().size(); ++k) {
        const ParameterTensor& t = part.tensors()[k];
        const ParameterTensor& w = whole.tensors()[k];
        for (int64_t i = 0; i < t.numel; ++i) {
          rebuilt[size_t(w.offset + t.source_element(i))] = piece[size_t(t.offset + i)];
          written[size_t(w.offset + t.source_element(i))] += 1;
        }
      }
    }
    EXPECT_EQ(0, std::memcmp(rebuilt.data(), original.data(), original.size() * sizeof(float)));
    // Cut tensors: every element from exactly one rank; whole tensors from every rank.
    for (const ParameterTensor& w : whole.tensors()) {
      const bool cut = w.name.find(".attn.") != std::string::npos ||
                       (!attention_only && w.name.find(".shared.") != std::string::npos);
      for (int64_t i = 0; i < w.numel; ++i) {
        ASSERT_EQ(written[size_t(w.offset + i)], cut ? 1 : degree) << w.name << " " << i;
      }
    }
  }
}

TEST(TensorParallelLayout, RangesSplitTheLayoutIntoCutAndWholeTensors) {
  const ModelConfig config = tp_config();
  for (bool attention_only : {false, true}) {
    const ParameterLayout part(config, {}, {}, {1, 2, attention_only});
    int64_t cut = 0, kept = 0;
    for (const ParameterTensor& t : part.tensors())
      (t.tp_split == Split::None ? kept : cut) += t.numel;
    int64_t in_cut = 0, in_kept = 0;
    for (const ParameterRange& r : tensor_parallel_ranges(part)) in_cut += r.count;
    for (const ParameterRange& r : tensor_replicated_ranges(part)) in_kept += r.count;
    EXPECT_EQ(in_cut, cut);
    EXPECT_EQ(in_kept, kept);
    // Q, K, V and wo of a layer are adjacent: one range per layer (plus the shared expert's).
    EXPECT_EQ(tensor_parallel_ranges(part).size(),
              size_t(config.n_layers * (attention_only ? 1 : 2)));
  }
  EXPECT_TRUE(tensor_parallel_ranges(ParameterLayout(config)).empty());
}

TEST(TensorParallelLayout, ExpertShardAndTensorSliceTogether) {
  const ModelConfig config = tp_config();
  const ParameterLayout whole(config);
  std::vector<float> whole_params(size_t(whole.total()));
  initialize_parameters(whole_params.data(), whole, config, 3);
  const ParameterLayout experts_only(config, {2, 2});
  const ParameterLayout both(config, {2, 2}, {}, {1, 2, false});
  std::vector<float> got(size_t(both.total())), want(size_t(both.total()), 0.0f);
  initialize_parameters(got.data(), both, config, 3);
  std::vector<float> expert_part(size_t(experts_only.total()));
  initialize_parameters(expert_part.data(), experts_only, config, 3);
  slice_parameters(expert_part.data(), experts_only, want.data(), both);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

TEST(TensorParallelValidation, NamesWhatDoesNotDivide) {
  const ModelConfig config = tp_config();  // 4 heads, shared expert 16 wide
  EXPECT_EQ(tensor_parallel_problem(config, 1, false, 1), "");
  EXPECT_EQ(tensor_parallel_problem(config, 2, false, 2), "");
  EXPECT_EQ(tensor_parallel_problem(config, 4, false, 8), "");
  auto message = [&](int degree, bool attention_only, int ranks) {
    try {
      validate_tensor_parallel(config, degree, attention_only, ranks);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(0, false, 4).find("--tensor-parallel 0: must be a positive integer"),
            std::string::npos);
  const std::string ranks = message(2, false, 3);
  EXPECT_NE(ranks.find("--tensor-parallel 2: does not divide the 3 ranks"), std::string::npos)
      << ranks;
  const std::string heads = message(3, false, 6);
  EXPECT_NE(heads.find("--tensor-parallel 3: does not divide the 4 attention heads"),
            std::string::npos)
      << heads;
  EXPECT_NE(heads.find("n_heads"), std::string::npos) << heads;
  EXPECT_NE(message(8, true, 8).find("attention heads"), std::string::npos);

  ModelConfig odd_shared = config;
  odd_shared.shared_expert_d_ff = 6;
  EXPECT_EQ(tensor_parallel_problem(odd_shared, 2, false, 2), "");
  EXPECT_EQ(tensor_parallel_problem(odd_shared, 4, true, 4), "");
  const std::string shared = tensor_parallel_problem(odd_shared, 4, false, 4);
  EXPECT_NE(shared.find("shared expert's hidden width 6"), std::string::npos) << shared;
  EXPECT_NE(shared.find("shared_expert_d_ff"), std::string::npos) << shared;
  ModelConfig no_shared = config;
  no_shared.shared_expert_d_ff = 0;
  EXPECT_EQ(tensor_parallel_problem(no_shared, 4, false, 4), "");
}

TEST(TensorParallelValidation, LayoutRefusesASliceThatDoesNotDivide) {
  const ModelConfig config = tp_config();
  EXPECT_THROW(ParameterLayout(config, {}, {}, {0, 3, false}), std::invalid_argument);
  EXPECT_THROW(ParameterLayout(config, {}, {}, {2, 2, false}), std::invalid_argument);
  ModelConfig odd_shared = config;
  odd_shared.shared_expert_d_ff = 6;
  EXPECT_THROW(ParameterLayout(odd_shared, {}, {}, {0, 4, false}), std::invalid_argument);
  EXPECT_NO_THROW(ParameterLayout(odd_shared, {}, {}, {0, 4, true}));
}

}  // namespace
}  // namespace rlf
