// Pipeline stages without MPI: a stage's layout holds exactly its layers' tensors with the whole
// model's initial values; forward_range/backward_range over every layer is the whole model bit
// for bit; and the p stages of a pipeline run in one process, in the order the unit-cost
// simulation of the schedule gives, with activations handed over by hand, produce the loss and
// every gradient of the single-rank model (double: to rounding; float: bit for bit or close),
// holding at most the schedule's bound of micro-batch chunks in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/arena.h"
#include "kernels/gpu.h"
#include "src/balance/stage_balance.h"
#include "src/model/pipeline_stage.h"
#include "src/model/transformer.h"
#include "src/runtime/pipeline_schedule.h"
#include "src/runtime/pipeline_step.h"
#include "tests/micro_model_config.h"
#include "tests/pipeline_batches.h"
#include "tests/test_util.h"

namespace rlf {
namespace {

ModelConfig deep_micro(int layers) {
  ModelConfig c = test::micro_config();
  c.n_layers = layers;
  return c;
}

TEST(PipelineLayout, StagesStoreTheirLayersOnceWithTheWholeModelsValues) {
  const ModelConfig config = deep_micro(6);
  Arena device("whole", 16 << 20);
  Transformer<float> whole(config, cpu_ops(), device, false);
  whole.initialize(42);
  const PipelineShape shape{3, 3, 2};
  const std::vector<int> boundaries = uniform_boundaries(6, shape.chunks());
  std::multiset<std::string> stored;
  for (int r = 0; r < shape.stages; ++r) {
    Arena stage_device("stage", 16 << 20);
    const std::vector<LayerRange> chunks = pipeline_rank_chunks(shape, r, boundaries);
    Transformer<float> stage(config, cpu_ops(), stage_device, false, {},
                             stage_layer_shard(chunks, config.n_layers));
    stage.initialize(42);
    EXPECT_EQ(stage.layout().stores_embedding(), r == 0);
    EXPECT_EQ(stage.layout().stores_head(), r == shape.stages - 1);
    for (int l = 0; l < config.n_layers; ++l) {
      // Rank r holds virtual stages r and r + 3: layers r and r + 3.
      EXPECT_EQ(stage.layout().stores_layer(l), l % 3 == r) << "rank " << r << " layer " << l;
    }
    for (const ParameterTensor& t : stage.layout().tensors()) {
      stored.insert(t.name);
      const ParameterTensor* w = whole.layout().find(t.name);
      ASSERT_NE(w, nullptr) << t.name;
      EXPECT_EQ(t.shape, w->shape) << t.name;
      EXPECT_EQ(0, std::memcmp(stage.parameters() + t.offset, whole.parameters() + w->offset,
                               size_t(t.numel) * sizeof(float)))
          << t.name << " differs from the whole model's";
    }
  }
  std::multiset<std::string> all;
  for (const ParameterTensor& t : whole.layout().tensors()) all.insert(t.name);
  EXPECT_EQ(stored, all) << "every tensor on exactly one stage";
}

TEST(PipelineLayout, WholeRangeIsTheWholeModelBitForBit) {
  const ModelConfig config = deep_micro(3);
  Arena device("device", 32 << 20);
  Transformer<float> a(config, cpu_ops(), device, true), b(config, cpu_ops(), device, true);
  a.initialize(5);
  b.initialize(5);
  const auto batch = test::random_micro_batches<float>(1, config.vocab_size, 9, 77)[0];
  const int N = batch.token_count(), V = config.vocab_size;
  const std::vector<float> d = test::random_vector<float>(size_t(N) * V, 78);
  const float* la = a.forward(batch.tokens.data(), batch.seq_offsets.data(), batch.sequences());
  std::vector<float> logits_a(la, la + size_t(N) * V);
  a.backward(d.data(), 0.1f);
  const float* lb = b.forward_range(batch.tokens.data(), batch.seq_offsets.data(),
                                    batch.sequences(), nullptr, 0, config.n_layers);
  EXPECT_EQ(0, std::memcmp(logits_a.data(), lb, logits_a.size() * sizeof(float)));
  b.backward_range(d.data(), 0.1f, nullptr);
  EXPECT_EQ(0, std::memcmp(a.gradients(), b.gradients(), size_t(a.parameter_count()) * 4));
}

TEST(PipelineLayout, AnEmptyBatchNeedsNoTokens) {
  // An expert-parallel rank may bring zero tokens (a null token pointer) and still take part.
  const ModelConfig config = deep_micro(2);
  Arena device("device", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, true);
  model.initialize(1);
  const std::vector<int> offsets{0};
  EXPECT_NO_THROW(model.forward(nullptr, offsets.data(), 0));
  EXPECT_NO_THROW(model.backward(nullptr, 0.1f));
}

TEST(PipelineLayout, AStageRefusesLayersItDoesNotStore) {
  const ModelConfig config = deep_micro(4);
  Arena device("device", 16 << 20);
  PipelineStage<float> stage(config, cpu_ops(), device, {{2, 4}}, 4 << 20);
  const std::vector<float> x(64, 0.5f);
  const std::vector<int> offsets{0, 4}, tokens{1, 2, 3, 4};
  EXPECT_THROW(stage.model().forward_range(nullptr, offsets.data(), 1, x.data(), 1, 3),
               std::logic_error);
  EXPECT_THROW(stage.model().forward(tokens.data(), offsets.data(), 1), std::logic_error);
  EXPECT_NO_THROW(stage.model().forward_range(nullptr, offsets.data(), 1, x.data(), 2, 4));
  EXPECT_THROW(PipelineStage<float>(config, cpu_ops(), device, {{0, 2}, {1, 3}}, 1 << 20),
               std::invalid_argument);
}

// A stage over a model without gradients runs forward only: each micro-batch's forward released
// after use reuses one activation arena, its last chunk's loss function sees the whole model's
// logits, and a backward is refused.
// The activation arenas are memory of the device arena's kind: CUDA managed memory where a GPU is
// usable (the kernels read and write them there; host memory would fault), host memory here.
TEST(PipelineLayout, ActivationArenasAreOfTheDeviceArenasKind) {
  const ModelConfig config = deep_micro(2);
  const MemoryKind kind = cuda_usable() ? MemoryKind::CudaManaged : MemoryKind::Host;
  Arena device("device", 16 << 20, kind);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                           stage_layer_shard({{0, 2}}, config.n_layers));
  model.initialize(3);
  PipelineStage<float> stage(model, {{0, 2}}, 4 << 20);
  stage.set_loss([](int, const float*, int, int, Arena&, float*) { return 0.0f; });
  const auto batches = test::random_micro_batches<float>(1, config.vocab_size, 7, 5);
  stage.forward(0, 0, batches[0], nullptr);
  ASSERT_EQ(stage.activation_arenas(), 1);
  EXPECT_EQ(stage.activation_arena(0).kind(), device.kind());
}

TEST(PipelineLayout, AForwardOnlyStageReleasesEachForwardAndRefusesBackward) {
  const ModelConfig config = deep_micro(4);
  Arena device("device", 16 << 20), whole_device("whole", 16 << 20);
  Transformer<float> model(config, cpu_ops(), device, /*with_gradients=*/false, ExpertShard{},
                           stage_layer_shard({{0, 4}}, config.n_layers));
  Transformer<float> whole(config, cpu_ops(), whole_device, /*with_gradients=*/false);
  model.initialize(3);
  whole.initialize(3);
  PipelineStage<float> stage(model, {{0, 4}}, 4 << 20);
  const auto batches = test::random_micro_batches<float>(3, config.vocab_size, 7, 5);
  std::vector<float> logits;
  stage.set_loss([&](int, const float* out, int N, int V, Arena&, float* dlogits) {
    EXPECT_EQ(dlogits, nullptr) << "a forward-only stage keeps no loss gradient";
    logits.assign(out, out + int64_t(N) * V);
    return 0.0f;
  });
  for (int m = 0; m < 3; ++m) {
    const auto& b = batches[size_t(m)];
    EXPECT_EQ(stage.forward(m, 0, b, nullptr), nullptr);
    const float* want = whole.forward(b.tokens.data(), b.seq_offsets.data(), b.sequences());
    ASSERT_EQ(logits.size(), size_t(b.token_count()) * size_t(config.vocab_size));
    EXPECT_EQ(0, std::memcmp(logits.data(), want, logits.size() * sizeof(float))) << m;
    whole.release_activations();
    if (m < 2) stage.release(m, 0);
  }
  EXPECT_EQ(stage.activation_arenas(), 1);
  EXPECT_THROW(stage.backward(2, 0, nullptr, 0.0f, nullptr), std::logic_error);
  EXPECT_THROW(stage.release(0, 0), std::logic_error);
}

// The pipeline in one process: rank r's stage runs its passes in its schedule's order; the
// ranks are interleaved in the order of the unit-cost simulation (a valid global order).
template <typename T>
void check_in_process_pipeline(const PipelineShape& shape, const std::vector<int>& boundaries,
                               const Ops<T>& ops, double atol, double rtol, uint64_t seed) {
  const ModelConfig config = deep_micro(boundaries.back());
  const T aux_weight = T(config.aux_loss_coef);
  const auto batches =
      test::random_micro_batches<T>(shape.micro_batches, config.vocab_size, 7, seed);
  Arena ref_device("reference", 32 << 20);
  Transformer<T> reference(config, ops, ref_device, true);
  reference.initialize(seed);
  const double want_loss = test::reference_step(reference, batches, aux_weight);

  std::vector<std::unique_ptr<Arena>> devices;
  std::vector<std::unique_ptr<PipelineStage<T>>> stages;
  std::vector<std::vector<PipelineOp>> schedules;
  for (int r = 0; r < shape.stages; ++r) {
    devices.push_back(std::make_unique<Arena>("stage", 16 << 20));
    stages.push_back(std::make_unique<PipelineStage<T>>(
        config, ops, *devices.back(), pipeline_rank_chunks(shape, r, boundaries), 8 << 20));
    stages.back()->model().initialize(seed);
    stages.back()->model().zero_gradients();
    schedules.push_back(pipeline_schedule(shape, r));
  }
  const ScheduleTiming timing = simulate_unit_schedule(shape);
  std::vector<std::tuple<double, int, size_t>> order;  // (start, rank, pass)
  for (int r = 0; r < shape.stages; ++r) {
    for (size_t i = 0; i < schedules[size_t(r)].size(); ++i) {
      order.emplace_back(timing.start[size_t(r)][i], r, i);
    }
  }
  std::sort(order.begin(), order.end());
  // Messages in flight: (kind, micro-batch, receiving virtual stage) -> rows.
  std::map<std::tuple<PassKind, int, int>, std::vector<T>> messages;
  const int last = shape.chunks() - 1, C = config.d_model;
  for (const auto& [start, r, i] : order) {
    const PipelineOp& op = schedules[size_t(r)][i];
    const int s = virtual_stage(shape, r, op.chunk);
    const PipelineMicroBatch<T>& b = batches[size_t(op.micro_batch)];
    const size_t rows = size_t(b.token_count()) * size_t(C);
    std::vector<T> input;
    if ((op.kind == PassKind::Forward && s > 0) || (op.kind == PassKind::Backward && s < last)) {
      auto found = messages.find({op.kind, op.micro_batch, s});
      ASSERT_NE(found, messages.end()) << "input not there: the order is not valid";
      input = std::move(found->second);
      messages.erase(found);
    }
    if (op.kind == PassKind::Forward) {
      const T* out = stages[size_t(r)]->forward(op.micro_batch, op.chunk, b, input.data());
      if (s < last) messages[{PassKind::Forward, op.micro_batch, s + 1}].assign(out, out + rows);
    } else {
      std::vector<T> dx(rows);
      stages[size_t(r)]->backward(op.micro_batch, op.chunk, input.data(), aux_weight, dx.data());
      if (s > 0) messages[{PassKind::Backward, op.micro_batch, s - 1}] = std::move(dx);
    }
  }
  EXPECT_TRUE(messages.empty());
  double loss = 0;
  for (int r = 0; r < shape.stages; ++r) {
    PipelineStage<T>& stage = *stages[size_t(r)];
    loss += double(stage.loss()) + double(aux_weight) * double(stage.aux_loss());
    EXPECT_EQ(stage.activation_arenas(), in_flight_bound(shape, r)) << "rank " << r;
    test::expect_stage_gradients(stage.model(), reference, atol, rtol);
  }
  EXPECT_NEAR(loss, want_loss, atol + rtol * std::abs(want_loss));
}

struct InProcessCase {
  PipelineShape shape;
  std::vector<int> boundaries;
};

std::vector<InProcessCase> in_process_cases() {
  return {{{1, 3, 1}, {0, 4}},
          {{2, 1, 1}, {0, 2, 4}},
          {{2, 4, 1}, {0, 2, 4}},
          {{2, 2, 2}, {0, 1, 2, 3, 4}},
          {{2, 4, 2}, {0, 1, 2, 3, 4}},
          {{4, 6, 1}, {0, 1, 2, 3, 4}},
          {{4, 4, 1}, {0, 1, 2, 3, 4}},
          {{1, 2, 3}, {0, 1, 3, 6}},
          {{3, 6, 2}, {0, 1, 3, 4, 5, 6, 8}},
          {{2, 3, 1}, {0, 3, 4}}};
}

template <typename T>
void check_every_case(const std::string& label, const Ops<T>& ops, double atol, double rtol) {
  int index = 0;
  for (const InProcessCase& c : in_process_cases()) {
    SCOPED_TRACE("p=" + std::to_string(c.shape.stages) +
                 " m=" + std::to_string(c.shape.micro_batches) +
                 " v=" + std::to_string(c.shape.virtual_stages));
    check_in_process_pipeline<T>(c.shape, c.boundaries, ops, atol, rtol,
                                 test::seed_for(label, index++));
  }
}

TEST(PipelineInProcess, EqualsTheSingleRankModelInDouble) {
  check_every_case<double>("pipeline-double", reference_ops<double>(), 1e-12, 1e-10);
}

TEST(PipelineInProcess, EqualsTheSingleRankModelInFloat) {
  check_every_case<float>("pipeline-float", cpu_ops(), 1e-6, 1e-5);
}

}  // namespace
}  // namespace rlf
